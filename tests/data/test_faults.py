"""Faults of the data tools: damaged inputs of a merge, and outputs the filesystem refuses.

Full (ENOSPC) and read-only (EROFS) disks are real tmpfs mounts (``tests/filesystems.py``);
permission errors (EACCES, EPERM) cannot be had as root on a real filesystem, so they are injected
where the tool opens its outputs. Every case must end with one ``error:`` line that names the file
and what to do, exit code 1, and nothing at the output paths (no temporary either).
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from megatron_ext.cli import merge_datasets, preprocess_data
from megatron_ext.config.exit_codes import ExitCode
from megatron_ext.data.atomic_files import WriteError, stage_file
from megatron_ext.data.indexed import IndexedDatasetFiles, IndexedWriter
from tests.data.helpers import tool
from tests.filesystems import read_only_filesystem, small_filesystem

pytestmark = pytest.mark.unit


def _dataset(prefix: Path, documents: int = 50, seed: int = 0) -> Path:
    """A small uint16 dataset of random documents (every document has tokens)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 400, size=documents)
    writer = IndexedWriter(prefix, np.uint16)
    writer.add_documents(rng.integers(0, 1000, size=int(lengths.sum())), lengths)
    writer.commit()
    return prefix


def _corpus(path: Path, documents: int = 300) -> Path:
    """Documents of numbers for the NullTokenizer (about 6 kB of tokens per 10 documents)."""
    path.write_text("".join(json.dumps({"text": " ".join(str(j % 900) for j in range(i % 300 + 1))}) + "\n"
                            for i in range(documents)))  # fmt: skip
    return path


def _run(main: Callable[[list[str]], int], argv: list[str]) -> tuple[int, list[str]]:
    """``main(argv)`` in this process: exit code and the non-empty lines it wrote to stderr."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    return code, [line for line in err.getvalue().splitlines() if line.strip()]


def _preprocess_argv(inp: Path, prefix: Path, workers: int = 1) -> list[str]:
    return ["--input", str(inp), "--output-prefix", str(prefix), "--tokenizer-type", "NullTokenizer",
            "--vocab-size", "1000", "--workers", str(workers), "--quiet"]  # fmt: skip


def _entries(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


# --------------------------------------------------------------- finding 5: merge verifies its inputs
@pytest.mark.parametrize("damage", ["truncated", "overlong"])
def test_merge_refuses_a_damaged_input_and_writes_nothing(tmp_path: Path, damage: str) -> None:
    good, bad = _dataset(tmp_path / "a"), _dataset(tmp_path / "b", seed=1)
    needed = IndexedDatasetFiles.open(bad).bin_bytes
    with open(f"{bad}.bin", "r+b") as f:
        if damage == "truncated":
            f.truncate(needed - 100)
        else:
            f.seek(0, 2)
            f.write(b"\0" * 6)
    found = needed - 100 if damage == "truncated" else needed + 6
    out = tmp_path / "out"
    out.mkdir()
    code, lines = _run(merge_datasets.main, ["--input", str(good), str(bad), "--output-prefix", str(out / "m")])
    assert code == ExitCode.ERROR and len(lines) == 1, lines
    what = "the .bin is truncated" if damage == "truncated" else "the .bin is longer than its index says"
    assert lines[0].startswith(
        f"error: input {bad}: {bad}.bin is {found:,} bytes but the index needs {needed:,}: {what}"
    )
    assert "Nothing was written" in lines[0] and "leave it out of --input" in lines[0], lines[0]
    assert _entries(out) == []


# --------------------------------------------------------------- finding 8: refused writes
@pytest.mark.parametrize("workers", [1, 2])
def test_preprocess_on_a_read_only_filesystem(tmp_path: Path, workers: int) -> None:
    inp = _corpus(tmp_path / "in.jsonl")
    with read_only_filesystem(tmp_path / "ro") as ro:
        proc = tool("preprocess_data", *_preprocess_argv(inp, ro / "x", workers), check=False)
        lines = proc.stderr.splitlines()
        assert proc.returncode == ExitCode.ERROR and lines == [
            f"error: cannot write {ro}/x_text_document.bin: read-only file system (EROFS); nothing was written; "
            "choose --output-prefix on a writable filesystem"
        ], proc.stderr
        assert _entries(ro) == []


@pytest.mark.parametrize("workers", [1, 2])
def test_preprocess_on_a_full_filesystem(tmp_path: Path, workers: int) -> None:
    inp = _corpus(tmp_path / "in.jsonl", documents=2000)  # about 1.3 MB of tokens
    with small_filesystem(tmp_path / "full", size_kib=256) as full:
        proc = tool("preprocess_data", *_preprocess_argv(inp, full / "x", workers), check=False)
        lines = proc.stderr.splitlines()
        assert proc.returncode == ExitCode.ERROR and lines == [
            f"error: cannot write {full}/x_text_document.bin: no space left on device (ENOSPC); nothing was written; "
            "free space or choose another --output-prefix"
        ], proc.stderr
        assert _entries(full) == []
        assert os.statvfs(full).f_bfree == os.statvfs(full).f_blocks  # no unnamed file holds space either


def test_preprocess_whatever_write_the_disk_fills_at(tmp_path: Path) -> None:
    """On filesystems of every size from too small for anything to just large enough, in page steps, the
    run either publishes complete datasets and report, or fails with one line and leaves nothing: the
    disk fills while writing the .bin, the .idx, the index spills, the report or none of them."""
    inp = _corpus(tmp_path / "in.jsonl", documents=60)
    outcomes = set()
    for size_kib in range(4, 28, 4):  # 4 kB tmpfs pages; the outputs and spills need 16 kB
        with small_filesystem(tmp_path / f"fs{size_kib}", size_kib=size_kib) as fs:
            code, lines = _run(preprocess_data.main, _preprocess_argv(inp, fs / "x"))
            if code == ExitCode.OK:
                assert lines == [] and IndexedDatasetFiles.open(fs / "x_text_document").verify() == []
                report = json.loads((fs / "x_preprocess_report.json").read_text())
                assert report["documents"] == 60
                assert _entries(fs) == ["x_preprocess_report.json", "x_text_document.bin", "x_text_document.idx"]
                outcomes.add("written")
            else:
                assert code == ExitCode.ERROR and len(lines) == 1, lines
                assert (
                    lines[0].startswith(f"error: cannot write {fs}/x_") and "(ENOSPC); nothing was written" in lines[0]
                )
                assert _entries(fs) == [], lines
                outcomes.add(lines[0].split(": ")[1].split("/x_")[1])  # which file it was
    assert "written" in outcomes and len(outcomes) >= 3, outcomes  # full at several places, then enough room


def test_stage_file_on_a_full_filesystem(tmp_path: Path) -> None:
    with small_filesystem(tmp_path / "fs", size_kib=8) as fs:
        with pytest.raises(WriteError, match=r"r\.json: no space left on device \(ENOSPC\); nothing was written"):
            stage_file(fs / "r.json", b"x" * 20_000)
        assert _entries(fs) == []


def test_a_report_that_cannot_be_written_publishes_no_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The report is staged with the datasets, before any of them is published: if it does not fit,
    nothing is published."""
    import megatron_ext.data.preprocess as preprocess

    def full(final: Path, data: bytes) -> Path:
        raise WriteError(final, OSError(errno.ENOSPC, "No space left on device"))

    monkeypatch.setattr(preprocess, "stage_file", full)
    out = tmp_path / "out"
    out.mkdir()
    code, lines = _run(preprocess_data.main, _preprocess_argv(_corpus(tmp_path / "in.jsonl"), out / "x"))
    assert code == ExitCode.ERROR and lines == [
        f"error: cannot write {out}/x_preprocess_report.json: no space left on device (ENOSPC); nothing was "
        "written; free space or choose another --output-prefix"
    ], lines
    assert _entries(out) == []


@pytest.mark.parametrize("kind", ["full", "read-only"])
def test_merge_on_a_refusing_filesystem(tmp_path: Path, kind: str) -> None:
    a, b = _dataset(tmp_path / "a", documents=200), _dataset(tmp_path / "b", documents=200, seed=2)
    mount = small_filesystem(tmp_path / "fs", size_kib=64) if kind == "full" else read_only_filesystem(tmp_path / "fs")
    with mount as fs:
        code, lines = _run(merge_datasets.main, ["--input", str(a), str(b), "--output-prefix", str(fs / "m")])
        what = (
            "no space left on device (ENOSPC); nothing was written; free space or choose another --output-prefix"
            if kind == "full"
            else "read-only file system (EROFS); nothing was written; choose --output-prefix on a writable filesystem"
        )
        assert code == ExitCode.ERROR and lines == [f"error: cannot write {fs}/m.bin: {what}"], lines
        assert _entries(fs) == []


@pytest.mark.parametrize("code", [errno.EACCES, errno.EPERM], ids=errno.errorcode.get)
@pytest.mark.parametrize("tool_name", ["preprocess", "merge"])
def test_permission_denied_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, tool_name: str
) -> None:
    """As root no real filesystem says EACCES, so the tool's own opening of its outputs is refused."""
    import megatron_ext.data.indexed as indexed

    out = tmp_path / "out"
    out.mkdir()
    real_open = os.open

    def refusing_open(path: object, flags: int, *args: object, **kwargs: object) -> int:
        if str(path).startswith(str(out)):
            raise OSError(code, os.strerror(code), str(path))
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    if tool_name == "preprocess":
        argv = _preprocess_argv(_corpus(tmp_path / "in.jsonl"), out / "x")
        main: Callable[[list[str]], int] = preprocess_data.main
        name = "x_text_document.bin"
    else:
        argv = ["--input", str(_dataset(tmp_path / "a")), "--output-prefix", str(out / "m")]
        main, name = merge_datasets.main, "m.bin"
    monkeypatch.setattr(indexed.os, "open", refusing_open)
    status, lines = _run(main, argv)
    monkeypatch.undo()
    said = "permission denied" if code == errno.EACCES else "operation not permitted"
    assert status == ExitCode.ERROR and lines == [
        f"error: cannot write {out / name}: {said} ({errno.errorcode[code]}); nothing was written; "
        f"make {out} writable for this user or choose another --output-prefix"
    ], lines
    assert _entries(out) == []
