"""bf16 and fp16 training as Megatron-LM runs them (Float16Module, fp32 main weights), on CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from megatron_ext.checkpoint.on_disk import read_tracker
from megatron_ext.config.exit_codes import ExitCode
from tests.conftest import TINY_MODEL, read_metrics, run_pretrain, train_losses

pytestmark = pytest.mark.distributed

# Learned absolute positions and LayerNorm: the parameters Megatron-Core leaves in
# fp32 unless the model is wrapped; DP2 shards the fp32 main weights.
BF16 = [*TINY_MODEL, "--bf16", "--use-distributed-optimizer", "--train-iters", "6"]


def test_bf16_trains_saves_and_resumes_exactly(tmp_path: Path) -> None:
    whole = tmp_path / "whole.jsonl"
    run_pretrain([*BF16, "--metrics-file", str(whole)], nproc=2)
    expected = train_losses(whole)
    assert sorted(expected) == list(range(1, 7))

    save, metrics = tmp_path / "ckpt", tmp_path / "parts.jsonl"
    run_pretrain(
        [*BF16, "--save", str(save), "--exit-interval", "3", "--metrics-file", str(metrics)],
        nproc=2,
        expect=ExitCode.SAVED_AND_STOPPED,
    )
    assert read_tracker(save) == 3
    run_pretrain([*BF16, "--load", str(save), "--metrics-file", str(metrics)], nproc=2)
    assert train_losses(metrics) == expected  # bit for bit across the save


def test_fp16_loss_scaler_finds_its_scale_without_stopping_the_run(tmp_path: Path) -> None:
    metrics = tmp_path / "m.jsonl"
    # Megatron's initial loss scale 2^32 overflows for a dozen steps while it halves;
    # those skips must not count as non-finite losses (--max-consecutive-skipped 3).
    run_pretrain([*TINY_MODEL, "--fp16", "--train-iters", "30", "--metrics-file", str(metrics)], nproc=1)
    rows = [r for r in read_metrics(metrics) if "lm_loss" in r]
    assert rows[-1]["skipped_total"] > 3  # the scaler did search
    trained = [r for r in rows if not r["skipped"]]
    assert len(trained) >= 5 and all(r["grad_norm"] is not None for r in trained)
    assert trained[-1]["lm_loss"] < rows[0]["lm_loss"]
