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


def test_use_checkpoint_args_resumes_from_a_command_line_without_the_models_flags(saved: Path, tmp_path: Path) -> None:
    """Megatron-LM's --use-checkpoint-args --use-mp-args-from-checkpoint-args: the shared run (PP2 × VP2, with
    dropout) goes on from iteration 3 given only its data, batch and length; the shape, switches and layout come
    from the checkpoint, and the run says which."""
    from tests.training.conftest import copy_of

    load = copy_of(saved, tmp_path)
    argv = ["--mock-data", "--vocab-size", "255", "--micro-batch-size", "2", "--global-batch-size", "8",
            "--lr", "1e-3", "--lr-warmup-iters", "2", "--lr-decay-iters", "40", "--lr-decay-style", "cosine",
            "--device", "cpu", "--seed", "1234", "--train-iters", "4", "--load", str(load),
            "--use-checkpoint-args", "--use-mp-args-from-checkpoint-args"]  # fmt: skip
    proc = run_pretrain(argv, nproc=2)
    log = proc.stdout + proc.stderr
    assert "--use-checkpoint-args: from" in log
    for taken in ("num_layers=8", "hidden_size=64", "hidden_dropout=0.1", "pipeline_model_parallel_size=2",
                  "virtual_pipeline_model_parallel_size=2"):  # fmt: skip
        assert taken in log, taken
    assert "loaded checkpoint" in log and "iteration      4/4" in log
