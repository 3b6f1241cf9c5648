"""Samples-based training with a batch ramp-up and decoupled learning rates, as Megatron-LM runs them.

One PP2 × VP2 run counted in samples (``--train-samples 70``) ramps the global
batch from 4 by 2 over the first 16 samples up to 8, warms the learning rate
up over 8 samples and decays it over the run, with the embedding and output
layer on their own rates (``--decoupled-lr``). The expected batch sizes,
iteration count and rates below are worked out by hand from Megatron-LM's
definitions, not taken from the code under test. The run's checkpoints include
the ramp's own, and a second run resumed from the one at iteration 2 (the
calculator must come back in the middle of the ramp) repeats the first one's
losses exactly.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from megatron_ext.config.runtime import TRACKER_FILENAME
from tests.conftest import TINY_MODEL, read_metrics, run_pretrain, train_losses

pytestmark = pytest.mark.distributed

ITERATION_SCHEDULE = {"--lr-warmup-iters", "--lr-decay-iters"}
MODEL = [
    a for i, a in enumerate(TINY_MODEL) if a not in ITERATION_SCHEDULE and TINY_MODEL[i - 1] not in ITERATION_SCHEDULE
]
LR, MIN_LR, DECOUPLED, DECOUPLED_MIN = 1e-3, 1e-4, 5e-3, 5e-4
WARMUP, SAMPLES = 8, 70
RUN = [
    *MODEL,
    *"--micro-batch-size 1 --pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2".split(),
    *f"--train-samples {SAMPLES} --rampup-batch-size 4 2 16 --lr-warmup-samples {WARMUP}".split(),
    *f"--lr {LR} --min-lr {MIN_LR} --decoupled-lr {DECOUPLED} --decoupled-min-lr {DECOUPLED_MIN}".split(),
]

# 16 ramp samples over (8 - 4) / 2 = 2 increments: +2 after every 8 samples, the full batch once more than 16.
# Consumed before each step: 0, 4, 8, 14, 20, ... → batches 4, 4, 6, 6, then 8. Megatron-LM's iteration count:
# the 4 ramp steps (20 samples), then (70 - 20) // 8 = 6 whole batches (2 samples dropped).
BATCHES = [4, 4, 6, 6, 8, 8, 8, 8, 8, 8]
CONSUMED_BEFORE = [sum(BATCHES[:i]) for i in range(len(BATCHES))]


def _rate(peak: float, final: float, samples: int) -> float:
    """Megatron-Core's linear warm-up from 0, then cosine decay to ``final`` at SAMPLES (--lr-decay-style cosine)."""
    if samples <= WARMUP:
        return peak * samples / WARMUP
    ratio = (samples - WARMUP) / (SAMPLES - WARMUP)
    return final + (peak - final) * 0.5 * (math.cos(math.pi * ratio) + 1.0)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(checkpoints, metrics) of the whole run, saving every 5 iterations."""
    root = tmp_path_factory.mktemp("ramp")
    save, metrics = root / "ckpt", root / "m.jsonl"
    run_pretrain([*RUN, "--save", str(save), "--save-interval", "5", "--metrics-file", str(metrics)], nproc=2)
    return save, metrics


def test_batches_iterations_and_rates_follow_megatron_lm(reference: tuple[Path, Path]) -> None:
    save, metrics = reference
    rows = [r for r in read_metrics(metrics) if "lm_loss" in r]
    assert [r["iteration"] for r in rows] == list(range(1, len(BATCHES) + 1))
    assert [r["global_batch_size"] for r in rows] == BATCHES
    assert [r["consumed_samples"] for r in rows] == [c + b for c, b in zip(CONSUMED_BEFORE, BATCHES, strict=True)]
    for row, consumed in zip(rows, CONSUMED_BEFORE, strict=True):
        assert row["lr"] == pytest.approx(_rate(LR, MIN_LR, consumed), rel=1e-6, abs=1e-12), row
        assert row["decoupled_lr"] == pytest.approx(_rate(DECOUPLED, DECOUPLED_MIN, consumed), rel=1e-6, abs=1e-12)
    losses = [r["lm_loss"] for r in rows]
    assert losses[-1] < losses[0] - 0.1
    # As Megatron-LM: a checkpoint before each step that takes a larger batch (before 3 and 5), then every 5.
    assert sorted(int(p.name.removeprefix("iter_")) for p in save.glob("iter_*")) == [2, 4, 5, 10]


def test_a_run_resumed_during_the_ramp_continues_exactly(reference: tuple[Path, Path], tmp_path: Path) -> None:
    save, expected = reference
    resume, metrics = tmp_path / "ckpt", tmp_path / "m.jsonl"
    shutil.copytree(save, resume)
    (resume / TRACKER_FILENAME).write_text("2\n")  # the ramp's own checkpoint, before the batch grows to 6
    run_pretrain([*RUN, "--load", str(resume), "--metrics-file", str(metrics)], nproc=2)
    rows = {r["iteration"]: r for r in read_metrics(metrics) if "lm_loss" in r}
    assert sorted(rows) == list(range(3, len(BATCHES) + 1))
    uninterrupted = train_losses(expected)
    for it, row in rows.items():
        assert row["lm_loss"] == uninterrupted[it], f"iteration {it}"
        assert row["global_batch_size"] == BATCHES[it - 1]
        assert row["consumed_samples"] == CONSUMED_BEFORE[it - 1] + BATCHES[it - 1]
