"""Fault injection on checkpoints: what a careless or unlucky user does to a run, and that nothing trained is lost.

Every case damages a copy of one shared saved run (``tests/training/conftest.py``: checkpoints of iterations
1, 2 and 3 under PP2 × VP2), or writes on a real full or read-only filesystem (``tests/filesystems.py``).
Each failure must be one error line naming the file and the fix, with the exit code of
``config/exit_codes.py``, and leave every checkpoint as it was. ``docs/checkpoints.md`` states the invariant;
the damaged-checkpoint cases of ``test_resilience.py`` use the same run.
"""

from __future__ import annotations

import shutil
import subprocess
import zlib
from pathlib import Path

import pytest

from megatron_ext.checkpoint.on_disk import (
    CHECKSUMS_FILENAME,
    SAVING_FILENAME,
    TRACKER_FILENAME,
    checkpoint_dir,
    read_tracker,
)
from megatron_ext.config.exit_codes import ExitCode
from megatron_ext.config.training_config import parse_args
from megatron_ext.estimate.derived_numbers import checkpoint_bytes
from tests import rank_client, waits
from tests.conftest import REPO, run_forked, run_pretrain, run_script, start_ranks, train_losses
from tests.filesystems import read_only_filesystem, small_filesystem
from tests.training.conftest import RUN, copy_of
from tests.waits import READY_S, RUN_S, STOP_S

pytestmark = pytest.mark.distributed


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` by relative path: (size, CRC-32)."""
    return {
        str(f.relative_to(root)): (f.stat().st_size, zlib.crc32(f.read_bytes()))
        for f in sorted(root.rglob("*"))
        if f.is_file()
    }


def _one_error_line(proc: subprocess.CompletedProcess[str], text: str) -> None:
    """``text`` is reported, and no Python traceback is."""
    output = proc.stdout + proc.stderr
    assert text in output, output[-3000:]
    assert "Traceback" not in output, output[-3000:]


def _tool(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """A tool forked from the rank server (``run_forked``): what is under test is what it says, not its start."""
    return run_forked(REPO / script, list(args))


# ------------------------------------------------------------------ 1. a missing tracker
def test_missing_tracker_is_refused_and_changes_nothing(saved: Path, tmp_path: Path) -> None:
    """Before: 'starting from scratch', then iterations 1-3 replaced one by one; exit 0."""
    ckpt = copy_of(saved, tmp_path)
    (ckpt / TRACKER_FILENAME).unlink()
    before = _snapshot(ckpt)
    proc = run_pretrain([*RUN, "--load", str(ckpt), "--save", str(ckpt)], nproc=2, expect=ExitCode.CHECKPOINT)
    _one_error_line(
        proc,
        f"--load {ckpt} has no {TRACKER_FILENAME} but holds finished checkpoints of iterations 1, 2, 3; nothing "
        f"was loaded or changed. To resume from 3: echo 3 > {ckpt / TRACKER_FILENAME} and run again",
    )
    assert _snapshot(ckpt) == before
    # Asked for: the same command with the flag is a valid plan (it would start over).
    dry = run_script([*RUN, "--load", str(ckpt), "--save", str(ckpt), "--world-size", "2", "--dry-run"])
    assert dry.returncode == ExitCode.CHECKPOINT
    dry = run_script(
        [*RUN, "--load", str(ckpt), "--save", str(ckpt), "--world-size", "2", "--dry-run", "--overwrite-checkpoints"]
    )
    assert dry.returncode == 0, dry.stderr


# ------------------------------------------------------------------ 2. a checkpoint without checksums.json
def test_checkpoint_without_manifest_is_loaded_read_only_and_kept(saved: Path, tmp_path: Path) -> None:
    """Before: loaded, then deleted by the same run's first save ('removing incomplete checkpoint')."""
    ckpt = copy_of(saved, tmp_path)
    (checkpoint_dir(ckpt, 3) / CHECKSUMS_FILENAME).unlink()
    kept = _snapshot(checkpoint_dir(ckpt, 3))
    proc = run_pretrain(
        [*RUN, "--train-iters", "4", "--load", str(ckpt), "--save", str(ckpt), "--keep-last-checkpoints", "1"],
        nproc=2,
    )
    assert "has no checksums.json (saved by an older version)" in proc.stdout
    assert "loaded checkpoint" in proc.stdout
    # Saved at 4; pruning to the newest complete one removed 1 and 2 and left the unverified 3 alone.
    assert sorted(p.name for p in ckpt.glob("iter_*")) == ["iter_0000003", "iter_0000004"]
    assert _snapshot(checkpoint_dir(ckpt, 3)) == kept
    assert read_tracker(ckpt) == 4
    assert not (checkpoint_dir(ckpt, 4) / SAVING_FILENAME).exists()


# ------------------------------------------------------------------ 3. a --save that cannot be written
def test_read_only_save_is_refused_before_training(tmp_path: Path) -> None:
    """Before: --dry-run accepted it, and the run trained until its first save, then died with an OSError."""
    with read_only_filesystem(tmp_path / "ro") as ro:
        flags = [*RUN, "--train-iters", "2", "--save", str(ro / "ckpt")]
        expected = f"--save {ro / 'ckpt'}: {ro} is on a read-only filesystem (EROFS); choose a writable directory"
        dry = run_script([*flags, "--world-size", "2", "--dry-run"])
        assert dry.returncode == ExitCode.INVALID and expected in dry.stderr
        proc = run_pretrain(flags, nproc=2, expect=ExitCode.INVALID)
    _one_error_line(proc, expected)
    assert "iteration" not in proc.stdout  # nothing trained


def test_save_without_room_for_one_checkpoint_is_refused_with_the_figures(tmp_path: Path) -> None:
    needed = checkpoint_bytes(parse_args([*RUN, "--world-size", "2"]))
    with small_filesystem(tmp_path / "small", size_kib=1024) as fs:
        dry = run_script([*RUN, "--save", str(fs / "ckpt"), "--world-size", "2", "--dry-run"])
    assert dry.returncode == ExitCode.INVALID
    assert f"one checkpoint of this run needs about {needed / 2**20:.1f} MiB; free space there" in dry.stderr


def test_the_checkpoint_size_estimate_is_the_saved_tensors(saved: Path) -> None:
    """The figure the check uses: exactly the bytes of every tensor saved (weights and Adam's state)."""
    from torch.distributed.checkpoint import FileSystemReader

    metadata = FileSystemReader(str(checkpoint_dir(saved, 3))).read_metadata().state_dict_metadata
    tensors = 0
    for item in metadata.values():
        if getattr(item, "size", None) is not None:
            count = 1
            for dim in item.size:
                count *= dim
            tensors += count * item.properties.dtype.itemsize
    assert checkpoint_bytes(parse_args([*RUN, "--world-size", "2"])) == tensors


def test_dry_run_prints_where_checkpoints_go(tmp_path: Path) -> None:
    dry = run_script([*RUN, "--save", str(tmp_path / "ckpt"), "--world-size", "2", "--dry-run"])
    assert dry.returncode == 0, dry.stderr
    assert f"--save {tmp_path / 'ckpt'}: " in dry.stdout and "free, about 4.8 MiB per checkpoint" in dry.stdout
    assert not (tmp_path / "ckpt").exists()


# ------------------------------------------------------------------ 8. a save that fails (disk full)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_full_disk_during_a_save_is_one_line_and_keeps_the_last_checkpoint(mode: str, tmp_path: Path) -> None:
    """Room for one checkpoint, not two: the periodic save of iteration 2 fails and training goes on; the save
    of iteration 3 fails too, a second failure in a row, and stops the run. Before: four CheckpointExceptions
    per rank and the partial directory left until the next save; then: the first failure ended the run."""
    extra = ["--async-save"] if mode == "async" else []
    with small_filesystem(tmp_path / "small", size_kib=8 * 1024) as fs:
        save = fs / "ckpt"
        proc = run_pretrain(
            [*RUN, *extra, "--train-iters", "3", "--save", str(save), "--save-interval", "1"],
            nproc=2,
            expect=ExitCode.CHECKPOINT,
        )
        assert proc.stdout.count("periodic save failed, training goes on") == 2, proc.stdout[-3000:]  # a rank each
        _one_error_line(proc, f"cannot write checkpoint {checkpoint_dir(save, 3)}: no space left on device (ENOSPC)")
        assert "The partial save was removed; iteration 1 is the last published checkpoint" in proc.stdout
        assert sorted(p.name for p in save.iterdir()) == ["iter_0000001", TRACKER_FILENAME]
        assert read_tracker(save) == 1
        assert not (checkpoint_dir(save, 1) / SAVING_FILENAME).exists()


def test_a_disk_that_fills_and_is_freed_costs_one_save(tmp_path: Path) -> None:
    """The disk fills after the run started (another job's files): the periodic save of iteration 10 fails, one
    line per rank, and training goes on; the space is freed and the saves of 20 and 30 are written."""
    with small_filesystem(tmp_path / "small", size_kib=24 * 1024) as fs:
        save, metrics, log = fs / "ckpt", tmp_path / "m.jsonl", tmp_path / "log"
        args = [
            *RUN,
            "--train-iters",
            "30",
            "--save",
            str(save),
            "--save-interval",
            "10",
            "--metrics-file",
            str(metrics),
        ]
        # Forked ranks, started and not waited for (the launcher's part is the signal tests').
        with open(log, "w") as out:
            ranks = start_ranks(args, nproc=2, out=out, err=out)
        try:
            waits.wait_for("the first iteration", lambda: metrics.exists() and train_losses(metrics), timeout=READY_S,
                           state=lambda: waits.tail(log))  # fmt: skip
            ballast = fs / "someone-else's-file"
            free = shutil.disk_usage(fs).free
            ballast.write_bytes(b"\0" * (free - 256 * 1024))
            waits.wait_for("the failed save", lambda: log.read_text().count("training goes on") == 2,
                           timeout=READY_S, state=lambda: waits.tail(log))  # fmt: skip
            ballast.unlink()
            finished = rank_client.wait_ranks(ranks, timeout=RUN_S)
        finally:
            for rank in ranks:  # on a failure above: gone before the small filesystem is unmounted
                if rank.poll() is None:
                    rank.kill()
                    rank.wait(timeout=STOP_S)
        output = log.read_text()
        assert finished, f"the run did not finish in {RUN_S:g} s (killed): {waits.tail(output)}"
        assert rank_client.exit_code(ranks) == ExitCode.OK, output[-3000:]
        assert f"cannot write checkpoint {checkpoint_dir(save, 10)}: no space left on device (ENOSPC)" in output
        assert sorted(p.name for p in save.iterdir()) == ["iter_0000020", "iter_0000030", TRACKER_FILENAME]
        assert read_tracker(save) == 30


# ------------------------------------------------------------------ 7. damaged metadata and trackers
@pytest.mark.parametrize(
    ("damage", "named"),
    [
        ("metadata.json", "iter_0000003/metadata.json is missing"),
        (".metadata", "iter_0000003/.metadata is missing"),
        (TRACKER_FILENAME, f"{TRACKER_FILENAME}: expected an iteration number, found binary bytes"),
    ],
)
def test_damaged_files_are_named_by_training_and_the_tools(
    damage: str, named: str, saved: Path, tmp_path: Path
) -> None:
    """Before: an uncaught CheckpointingException on every rank (metadata.json), a UnicodeDecodeError
    traceback (binary tracker); the tools blamed the wrong file or printed an AttributeError."""
    ckpt = copy_of(saved, tmp_path)
    if damage == TRACKER_FILENAME:
        (ckpt / TRACKER_FILENAME).write_bytes(b"\xff\xfe\x00\x01")
    else:
        (checkpoint_dir(ckpt, 3) / damage).unlink()
    before = _snapshot(ckpt)
    # The hard stop (--no-checkpoint-fallback); the fallback itself is test_resilience.py's.
    hard = ["--no-checkpoint-fallback"]
    proc = run_pretrain([*RUN, *hard, "--load", str(ckpt), "--save", str(ckpt)], nproc=2, expect=ExitCode.CHECKPOINT)
    _one_error_line(proc, named)
    for tool in (
        ["tools/generate.py", "--load", str(ckpt), "--prompt", "1 2 3", "--max-new-tokens", "1"],
        ["tools/convert_checkpoint.py", "to-hf", "--load", str(ckpt), "--output", str(tmp_path / "hf")],
    ):
        out = _tool(*tool)
        assert out.returncode == ExitCode.CHECKPOINT, out.stderr
        _one_error_line(out, named)
        if damage != TRACKER_FILENAME:  # the tool names the checkpoint to take instead
            assert "the newest earlier checkpoint is iteration 2: pass --iteration 2 to use it" in out.stderr
    assert _snapshot(ckpt) == before
    assert not (tmp_path / "hf").exists()
