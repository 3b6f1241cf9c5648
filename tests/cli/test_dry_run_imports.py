"""``pretrain_gpt.py --dry-run`` stays light: neither torch nor Megatron-Core is imported (about 3 s on CPU).

The recipes dry-run every launch with ``--load`` naming the run's checkpoint
directory; only a directory that holds a checkpoint makes the dry run read it
(with torch), as a resumed run keeps the checkpoint's padded vocabulary.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from megatron_ext.config.exit_codes import ExitCode
from megatron_ext.config.runtime import TRACKER_FILENAME
from tests.conftest import PRETRAIN, REPO, _env
from tests.waits import QUICK_S

pytestmark = pytest.mark.unit

HEAVY = {"torch", "megatron"}
DRY_RUN = "--model gpt-tiny --mock-data --train-iters 4 --dry-run".split()


def dry_run(args: list[str]) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run pretrain_gpt.py as the recipes do; also the top-level packages it imported (``-X importtime``)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", str(PRETRAIN), *args],
        capture_output=True, text=True, timeout=QUICK_S, env=_env(), cwd=REPO,
    )  # fmt: skip
    imported = {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    return proc, imported


def test_a_dry_run_imports_neither_torch_nor_megatron_core(tmp_path: Path) -> None:
    # --load as the recipes pass it on a first run: a directory that does not exist yet.
    proc, imported = dry_run([*DRY_RUN, "--load", str(tmp_path / "checkpoints"), "--save", str(tmp_path / "c")])
    assert proc.returncode == ExitCode.OK, proc.stderr[-2000:]
    assert "configuration is valid" in proc.stdout
    assert "megatron_ext" in imported  # the probe sees imports at all
    assert not imported & HEAVY, sorted(imported & HEAVY)


def test_an_invalid_configuration_is_refused_without_them() -> None:
    proc, imported = dry_run([*DRY_RUN, "--world-size", "3", "--pipeline-model-parallel-size", "2"])
    assert proc.returncode == ExitCode.INVALID
    assert "world_size=3 is not divisible by tensor(1) × pipeline(2) = 2" in proc.stderr
    assert not imported & HEAVY


def test_a_directory_with_a_checkpoint_tracker_is_read(tmp_path: Path) -> None:
    """A damaged tracker under --load is named without torch (the format is ``checkpoint.on_disk``); with a
    readable one the checkpoint's index is read, which takes torch."""
    (tmp_path / TRACKER_FILENAME).write_text("not a number\n")
    proc, imported = dry_run([*DRY_RUN, "--load", str(tmp_path)])
    assert proc.returncode == ExitCode.CHECKPOINT, proc.stderr[-2000:]
    assert f"{tmp_path / TRACKER_FILENAME}: expected an iteration number, found 'not a number'" in proc.stderr
    assert not imported & HEAVY
    (tmp_path / TRACKER_FILENAME).write_text("3\n")
    proc, imported = dry_run([*DRY_RUN, "--load", str(tmp_path)])
    # The checkpoint is looked at before anything is built (resume.preflight_resume), which takes torch.
    assert proc.returncode == ExitCode.CHECKPOINT, proc.stderr[-2000:]
    assert f"iteration 3: {tmp_path / 'iter_0000003'} does not exist" in proc.stderr
    assert "torch" in imported
