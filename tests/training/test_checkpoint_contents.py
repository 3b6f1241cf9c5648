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
    from tests.training.conftest import ITERS, copy_of

    load = copy_of(saved, tmp_path)
    argv = ["--mock-data", "--vocab-size", "255", "--micro-batch-size", "2", "--global-batch-size", "8",
            "--lr", "1e-3", "--lr-warmup-iters", "2", "--lr-decay-iters", str(ITERS), "--lr-decay-style", "cosine",
            "--device", "cpu", "--seed", "1234", "--train-iters", "4", "--load", str(load),
            "--use-checkpoint-args", "--use-mp-args-from-checkpoint-args"]  # fmt: skip
    proc = run_pretrain(argv, nproc=2)
    log = proc.stdout + proc.stderr
    assert "--use-checkpoint-args: from" in log
    for taken in ("num_layers=8", "hidden_size=64", "hidden_dropout=0.1", "pipeline_model_parallel_size=2",
                  "virtual_pipeline_model_parallel_size=2"):  # fmt: skip
        assert taken in log, taken
    assert "loaded checkpoint" in log and "iteration      4/4" in log


def test_log_progress_writes_megatron_lms_progress_file_across_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--log-progress: 'Starting job' and one 'Saved checkpoint' line per save, tab-separated as Megatron-LM writes
    them; the cumulative throughput counts from the first job of the same world size."""
    from megatron_ext.config.training_config import parse_args
    from megatron_ext.estimate.flops import flops_per_step

    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    save = tmp_path / "ckpt"
    flags = [*TINY_MODEL, "--save", str(save), "--save-interval", "2", "--log-progress"]
    run_pretrain([*flags, "--train-iters", "2"])
    run_pretrain([*flags, "--load", str(save), "--train-iters", "4"])
    lines = [line.split("\t") for line in (save / "progress.txt").read_text().splitlines()]
    assert [fields[3] for fields in lines] == ["Starting job", "Saved checkpoint", "Starting job", "Saved checkpoint"]
    assert all(fields[1] == "Job ID: 4242" and fields[2] == "# GPUs: 1" for fields in lines)
    cfg = parse_args(flags)
    per_sample = flops_per_step(cfg.model, batch_size=1, padded_vocab_size=cfg.padded_vocab_size)
    last = lines[-1]
    assert last[4] == "Iteration: 4" and last[5].startswith("Job throughput: ") and last[5].endswith(" TFLOP/s/GPU")
    assert last[6].startswith("Cumulative throughput: ")
    assert float(last[7].split(": ")[1]) == pytest.approx(4 * 8 * per_sample, rel=1e-2)  # 32 samples so far
    assert last[8] == f"Tokens (in billions): {32 * 32 / 1e9:.2f}"


def test_the_cumulative_throughput_restarts_with_another_world_size(tmp_path: Path) -> None:
    """As Megatron-LM reads progress.txt back: the first 'Starting job' of the latest run of jobs with this world
    size, and the operations of the last save before it."""
    from datetime import datetime

    from megatron_ext.training.progress_log import append, saved_event, start_of_same_world_size

    t = [datetime(2026, 1, 1, 0, m) for m in range(6)]
    append(tmp_path, "Starting job", world_size=8, now=t[0])
    append(tmp_path, "Saved checkpoint\tIteration: 10\tJob throughput: 1.0 TFLOP/s/GPU\tCumulative throughput: "
           "1.0 TFLOP/s/GPU\tFloating-point operations: 1.00e+15\tTokens (in billions): 0.01", world_size=8, now=t[1])  # fmt: skip
    append(tmp_path, "Starting job", world_size=4, now=t[2])
    assert start_of_same_world_size(tmp_path, 4) == (t[2], 1e15)
    append(tmp_path, "Starting job", world_size=8, now=t[3])
    assert start_of_same_world_size(tmp_path, 8) == (t[3], 1e15)  # the 8-GPU jobs before the 4-GPU one are over
    event = saved_event(20, save=tmp_path, world_size=8, flops_so_far=1e15 + 8 * 60e12, job_start_flops=1e15,
                        job_seconds=60.0, tokens_so_far=2 * 10**7, background=False, now=t[4])  # fmt: skip
    assert event == (
        "Saved checkpoint\tIteration: 20\tJob throughput: 1.0 TFLOP/s/GPU\tCumulative throughput: 1.0 TFLOP/s/GPU\t"
        "Floating-point operations: 1.48e+15\tTokens (in billions): 0.02"
    )
