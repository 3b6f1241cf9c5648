"""``convert_checkpoint.py`` on a full, read-only or forbidden filesystem: one ``error:`` line naming the output,
the file and the fix, exit code 3 (a checkpoint that cannot be written, as for pretrain_gpt.py's saves), and
nothing left behind (no partial export, no staging directory, no parent directory the run made). The filesystems
are real tmpfs mounts (tests/filesystems.py)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch

from megatron_ext.config.exit_codes import ExitCode
from megatron_ext.huggingface.convert import OutputError, ShardWriter, _staging
from tests.data.helpers import tool
from tests.filesystems import read_only_filesystem, small_filesystem


def _one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: cannot write "), stderr
    assert "Traceback" not in stderr and "SafetensorError" not in stderr, stderr
    return lines[0]


@pytest.mark.distributed
def test_export_to_a_full_disk_is_one_line_and_leaves_nothing(seed_checkpoint: Path, tmp_path: Path) -> None:
    with small_filesystem(tmp_path / "small", size_kib=512) as fs:
        output = fs / "new" / "hf"  # parents the run makes, removed with the failed export
        # 100 KB shards: a few are written before the disk (512 KiB for 1.7 MB of weights) is full.
        proc = tool("convert_checkpoint", "to-hf", "--load", str(seed_checkpoint), "--output", str(output),
                    "--max-shard-size", "100KB", check=False)  # fmt: skip
        assert proc.returncode == ExitCode.CHECKPOINT, proc.stderr
        line = _one_error_line(proc.stderr)
        assert f"cannot write {output}: no space left on device (ENOSPC) writing shard-" in line, line
        assert line.endswith("free space or choose another --output"), line
        assert list(fs.iterdir()) == []


@pytest.mark.distributed
def test_export_to_a_read_only_filesystem_is_one_line(seed_checkpoint: Path, tmp_path: Path) -> None:
    with read_only_filesystem(tmp_path / "ro") as fs:
        proc = tool("convert_checkpoint", "to-hf", "--load", str(seed_checkpoint), "--output", str(fs / "hf"),
                    check=False)  # fmt: skip
        assert proc.returncode == ExitCode.CHECKPOINT, proc.stderr
        line = _one_error_line(proc.stderr)
        assert f"cannot write {fs / 'hf'}: read-only file system (EROFS) creating its staging directory" in line, line
        assert line.endswith("choose --output on a writable filesystem"), line
        assert list(fs.iterdir()) == []


@pytest.mark.unit
def test_a_full_disk_mid_shard_is_named_without_a_process_group(tmp_path: Path) -> None:
    """safetensors' own error (no errno, no file name) becomes the OutputError naming the shard."""
    with small_filesystem(tmp_path / "small", size_kib=64) as fs:
        full = r"no space left on device \(ENOSPC\) writing shard-1\.tmp; free space"
        with pytest.raises(OutputError, match=full), _staging(fs / "hf") as staging:
            writer = ShardWriter(staging, max_bytes=40_000)
            for i in range(4):
                writer.add(f"t{i}", torch.zeros(10_000))  # 40 kB each: the second shard does not fit
            writer.close()
        assert list(fs.iterdir()) == []


@pytest.mark.unit
@pytest.mark.parametrize(
    ("code", "reason"), [(errno.EACCES, "permission denied"), (errno.EPERM, "operation not permitted")]
)
def test_forbidden_writes_name_the_file_and_reads_stay_as_they_are(tmp_path: Path, code: int, reason: str) -> None:
    target = tmp_path / "out" / "hf"
    with pytest.raises(OutputError) as exc, _staging(target, flag="--save") as staging:
        raise OSError(code, os.strerror(code), str(staging / "config.json"))
    assert str(exc.value) == (
        f"cannot write {target}: {reason} ({errno.errorcode[code]}) writing config.json; make {target.parent} "
        "writable for this user or choose another --save"
    )
    assert list(tmp_path.iterdir()) == []  # the staging directory and the parent it made are gone
    # The same error on a file the conversion reads is not the output's fault: left as it is.
    unreadable = OSError(code, os.strerror(code), str(tmp_path / "checkpoint" / "metadata.json"))
    with pytest.raises(OSError) as raised, _staging(target):
        raise unreadable
    assert raised.value is unreadable and not target.exists()
