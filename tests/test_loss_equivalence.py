"""Loss equivalence across layouts: the proof that the parallelism is right.

Every layout starts from the same seed checkpoint (identical initial weights,
saved once under TP1·PP1), trains 10 iterations on the same mock data with
the same global batch (8 sequences of 32 tokens) in fp32 on CPU with dropout
off, and must reproduce the per-iteration loss of the TP1·PP1·DP1 baseline to
a relative 1e-5. Tensor parallelism changes the order of floating-point sums,
so bit-equality is not expected; a wrong split, a lost microbatch, a wrong
gradient average or a mis-ordered interleaved schedule all show up as
differences of 1e-3 or more within a few iterations.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import TINY_MODEL, run_pretrain, train_losses

pytestmark = pytest.mark.distributed

ITERS = 10
REL_TOL = 1e-5

LAYOUTS = {
    "tp2": (2, ["--tensor-model-parallel-size", "2"]),
    "pp2": (2, ["--pipeline-model-parallel-size", "2"]),
    "pp2-vp2": (2, ["--pipeline-model-parallel-size", "2", "--virtual-pipeline-model-parallel-size", "2"]),
    "pp4-vp2": (4, ["--pipeline-model-parallel-size", "4", "--num-layers-per-virtual-pipeline-stage", "1"]),
    "dp2-distopt": (2, ["--use-distributed-optimizer"]),
    "tp2-pp2-vp2": (
        4,
        ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
         "--num-layers-per-virtual-pipeline-stage", "2"],
    ),
}


def _train(seed: Path, metrics: Path, nproc: int, layout: list[str]) -> dict[int, float]:
    run_pretrain(
        [*TINY_MODEL, *layout, "--train-iters", str(ITERS), "--load", str(seed), "--metrics-file", str(metrics)],
        nproc=nproc,
    )
    losses = train_losses(metrics)
    assert sorted(losses) == list(range(1, ITERS + 1))
    return losses


@pytest.fixture(scope="module")
def baseline(seed_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    losses = _train(seed_checkpoint, tmp_path_factory.mktemp("baseline") / "m.jsonl", 1, [])
    # The mock data is learnable: the baseline itself must be training.
    assert losses[ITERS] < losses[1] - 0.1
    return losses


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_baseline(name: str, baseline: dict[int, float], seed_checkpoint: Path, tmp_path: Path) -> None:
    nproc, flags = LAYOUTS[name]
    losses = _train(seed_checkpoint, tmp_path / "m.jsonl", nproc, flags)
    for it in range(1, ITERS + 1):
        assert losses[it] == pytest.approx(baseline[it], rel=REL_TOL), (
            f"{name}: iteration {it} loss {losses[it]!r} != baseline {baseline[it]!r}"
        )
