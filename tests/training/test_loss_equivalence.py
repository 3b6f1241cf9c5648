"""Loss equivalence across layouts: the proof that the parallelism is right.

Every layout starts from the same seed checkpoint (identical initial weights,
saved once under TP1·PP1), trains 10 iterations on the same mock data with
the same global batch (8 sequences of 32 tokens) in fp32 on CPU with dropout
off, and must reproduce the per-iteration loss and gradient norm of the
TP1·PP1·DP1 baseline to a relative 1e-5 (with Adam and clipping the loss alone
barely notices a gradient scaled by a constant, such as a DP sum instead of a
mean; the norm does). The core attention is PyTorch's SDPA (the local spec's
default here) everywhere except one TP2 run with Megatron-Core's own
``DotProductAttention``, which must match too. Tensor parallelism changes
the order of floating-point sums, so bit-equality is not expected; a wrong
split, a lost microbatch, a wrong gradient average or a mis-ordered
interleaved schedule all show up as differences of 1e-3 or more within a
few iterations.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import assert_matches_baseline, train_from_seed

pytestmark = pytest.mark.distributed

LAYOUTS = {
    "tp2": (2, ["--tensor-model-parallel-size", "2"]),
    "pp2": (2, ["--pipeline-model-parallel-size", "2"]),
    "pp2-vp2": (2, "--pipeline-model-parallel-size 2 --virtual-pipeline-model-parallel-size 2".split()),
    "pp4-vp2": (4, "--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 1".split()),
    "dp2-distopt": (2, ["--use-distributed-optimizer"]),
    "pp2-vp2-dp2-distopt-overlap": (
        4,
        "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2 --use-distributed-optimizer "
        "--overlap-grad-reduce --overlap-param-gather".split(),
    ),
    # The baseline runs the local spec with SDPA core attention (the default);
    # Megatron-Core's own DotProductAttention must give the same losses.
    "tp2-sequence-parallel": (2, "--tensor-model-parallel-size 2 --sequence-parallel".split()),
    "tp2-megatron-core-attention": (2, "--tensor-model-parallel-size 2 --attention-backend local".split()),
    # The seed's 256 rows; TP2 with --make-vocab-size-divisible-by 256 would pad to 512: the checkpoint's
    # padding must be kept (extra rows would enter every softmax). tests/training/test_vocab_padding.py has more.
    "tp2-keeps-the-seed-padding": (2, "--tensor-model-parallel-size 2 --make-vocab-size-divisible-by 256".split()),
    "tp2-pp2-vp2": (
        4,
        "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2".split(),
    ),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_baseline(
    name: str,
    baseline: dict[int, float],
    baseline_grad_norms: dict[int, float],
    seed_checkpoint: Path,
    tmp_path: Path,
) -> None:
    nproc, flags = LAYOUTS[name]
    train_from_seed(seed_checkpoint, tmp_path / "m.jsonl", nproc, flags)
    assert_matches_baseline(tmp_path / "m.jsonl", baseline, baseline_grad_norms, name=name)
