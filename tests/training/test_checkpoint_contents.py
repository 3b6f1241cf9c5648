"""What a checkpoint holds when Megatron-LM's --no-save-optim and --no-save-rng leave parts out, and how a run
resumes from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from megatron_ext.checkpoint.on_disk import checkpoint_dir
from tests.conftest import TINY_MODEL, run_pretrain

pytestmark = pytest.mark.distributed


def test_a_checkpoint_without_optimizer_and_rng_state_resumes_with_fresh_ones(tmp_path: Path) -> None:
    from megatron.core import dist_checkpointing

    from megatron_ext.training.checkpointing import saved_common

    save = tmp_path / "ckpt"
    flags = [*TINY_MODEL, "--hidden-dropout", "0.1", "--save", str(save), "--save-interval", "2"]
    run_pretrain([*flags, "--train-iters", "2", "--no-save-optim", "--no-save-rng"])
    path = checkpoint_dir(save, 2)
    common = saved_common(path)
    assert common["has_optimizer_state"] is False and common["has_rng_state"] is False
    keys = set(dist_checkpointing.load_tensors_metadata(str(path)))
    assert keys and not [k for k in keys if "optimizer" in k or "rng" in k]

    resumed = run_pretrain([*flags, "--load", str(save), "--train-iters", "4"])
    log = resumed.stdout + resumed.stderr
    assert "was saved without RNG states (--no-save-rng): this run draws new random numbers" in log
    assert saved_common(checkpoint_dir(save, 4))["has_optimizer_state"] is True  # saved again in full
