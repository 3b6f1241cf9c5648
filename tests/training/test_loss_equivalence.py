"""Loss equivalence across layouts: the proof that the parallelism is right (also for the model variants).

Every layout starts from the same seed checkpoint (identical initial weights,
saved once under TP1·PP1), trains 6 iterations on the same mock data with
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

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import (
    TINY_MODEL,
    assert_matches_baseline,
    grad_norms,
    params_norms,
    run_pretrain,
    train_from_seed,
    train_losses,
)

pytestmark = pytest.mark.distributed

LAYOUTS = {
    "tp2": (2, ["--tensor-model-parallel-size", "2"]),
    "pp2": (2, ["--pipeline-model-parallel-size", "2"]),
    "pp2-vp2": (2, "--pipeline-model-parallel-size 2 --virtual-pipeline-model-parallel-size 2".split()),
    # Interleaved with Megatron-LM's --no-overlap-p2p-communication: batched, blocking transfers (PP > 2).
    "pp4-vp2-blocking-p2p": (
        4,
        "--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 1 "
        "--no-overlap-p2p-communication".split(),
    ),
    "dp2-distopt": (2, ["--use-distributed-optimizer"]),
    "pp2-vp2-dp2-distopt-overlap": (
        4,
        "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2 --use-distributed-optimizer "
        "--overlap-grad-reduce --overlap-param-gather --ddp-num-buckets 3 --ddp-pad-buckets-for-high-nccl-busbw "
        "--no-gradient-reduce-div-fusion --use-tp-pp-dp-mapping".split(),
    ),
    # The baseline runs the local spec with SDPA core attention (the default);
    # Megatron-Core's own DotProductAttention must give the same losses.
    "tp2-sequence-parallel": (2, "--tensor-model-parallel-size 2 --sequence-parallel".split()),
    # With it (one run for both): the seed's 256 rows; TP2 with --make-vocab-size-divisible-by 256 would pad
    # to 512: the checkpoint's padding must be kept (extra rows would enter every softmax).
    # tests/training/test_vocab_padding.py has more.
    "tp2-megatron-core-attention-keeps-the-seed-padding": (
        2,
        "--tensor-model-parallel-size 2 --attention-backend local --make-vocab-size-divisible-by 256".split(),
    ),
    "tp2-pp2-vp2": (
        4,
        "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2".split(),
    ),
    # Uneven stages (Megatron-Core places the layers; ParallelLayout.stages is checked against it at build).
    # First rank 2 layers (1 per chunk), last rank 6 (3 per chunk), interleaved.
    "pp2-vp2-first-stage-2-layers": (
        2,
        "--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 "
        "--decoder-first-pipeline-num-layers 2".split(),
    ),
    # Interleaved 1F1B with the 4 microbatches in one group (Megatron-Core's default group is PP = 2).
    "pp2-vp2-microbatch-group-4": (
        2,
        "--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 "
        "--microbatch-group-size-per-virtual-pipeline-stage 4".split(),
    ),
    # 8 layers + the embedding = 9 slots on 3 ranks: E+2 | 3 | 3.
    "pp3-account-for-embedding": (
        3,
        "--pipeline-model-parallel-size 3 --account-for-embedding-in-pipeline-split".split(),
    ),
    # ZB-H1 (--enable-zero-bubble): Megatron-Core's 1F1B with the linear layers' weight gradients in W passes,
    # rank r keeping r of them back; the same arithmetic, so the same losses.
    "pp2-zb-h1": (2, "--pipeline-model-parallel-size 2 --enable-zero-bubble".split()),
    "pp4-zb-h1": (4, "--pipeline-model-parallel-size 4 --enable-zero-bubble".split()),
    "tp2-pp2-zb-h1": (
        4,
        "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --enable-zero-bubble".split(),
    ),
    "pp2-dp2-distopt-overlap-zb-h1": (
        4,
        "--pipeline-model-parallel-size 2 --use-distributed-optimizer --overlap-grad-reduce --ddp-num-buckets 3 "
        "--enable-zero-bubble".split(),
    ),
    # Sequence parallelism: the forward gathers each column-parallel layer's input, B reduce-scatters its
    # gradient, and W gathers the input again.
    "tp2-pp2-sequence-parallel-zb-h1": (
        4,
        "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel "
        "--enable-zero-bubble".split(),
    ),
    # Full recomputation: the checkpointed layers' forward reruns inside the backward, whose B defers the W.
    "pp2-full-recompute-zb-h1": (
        2,
        "--pipeline-model-parallel-size 2 --recompute-granularity full --recompute-method uniform "
        "--recompute-num-layers 1 --enable-zero-bubble".split(),
    ),
    "pp2-first-stage-3-layers-zb-h1": (
        2,
        "--pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers 3 --enable-zero-bubble".split(),
    ),
    # ZB interleaved (--enable-zero-bubble with virtual stages): Megatron-Core's interleaved 1F1B split the same
    # way, rank r keeping the W passes simulation chooses; overlapped transfers (the default), batched ones,
    # DDP's reductions started by the schedule (aligned) and by the buckets (--no-align-grad-reduce).
    "pp2-vp2-zb-interleaved": (
        2,
        "--pipeline-model-parallel-size 2 --virtual-pipeline-model-parallel-size 2 --enable-zero-bubble".split(),
    ),
    "pp4-vp2-blocking-p2p-zb-interleaved": (
        4,
        "--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 1 --no-overlap-p2p-communication "
        "--enable-zero-bubble".split(),
    ),
    "tp2-pp2-vp2-sequence-parallel-zb-interleaved": (
        4,
        "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2 "
        "--sequence-parallel --enable-zero-bubble".split(),
    ),
    "pp2-vp2-dp2-distopt-overlap-zb-interleaved": (
        4,
        "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2 --use-distributed-optimizer "
        "--overlap-grad-reduce --ddp-num-buckets 3 --enable-zero-bubble".split(),
    ),
    "pp2-vp2-first-stage-2-layers-dp2-overlap-unaligned-zb-interleaved": (
        4,
        "--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 "
        "--decoder-first-pipeline-num-layers 2 --overlap-grad-reduce --no-align-grad-reduce "
        "--enable-zero-bubble".split(),
    ),
}
# The layout-string row and uneven <-> even resharding are in test_checkpoint_resharding.py.

ODD_LAYERS = ["--num-layers", "7"]
"""An odd layer count: its own seed and baseline (TINY_MODEL with 7 layers)."""
ODD_LAYOUTS = {
    # 7 layers + embedding + loss = 9 slots on 3 ranks: E+2 | 3 | 2+L.
    "7-layers-pp3-account-for-embedding-and-loss": (
        3,
        "--pipeline-model-parallel-size 3 --account-for-embedding-in-pipeline-split "
        "--account-for-loss-in-pipeline-split".split(),
    ),
    # Megatron-Core's layout string, interleaved: E+1 | 2 | 2 | 2+L.
    "7-layers-pp2-layout-string-vp2": (
        2,
        ["--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout", "Et|tt|tt|ttL"],
    ),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_baseline(
    name: str,
    baseline: dict[int, float],
    baseline_grad_norms: dict[int, float],
    baseline_metrics: Path,
    seed_checkpoint: Path,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    nproc, flags = LAYOUTS[name]
    if name == "tp2":
        # The run that tests/huggingface exports (it saves what it trained).
        metrics = request.getfixturevalue("tp2_run").metrics
    else:
        metrics = tmp_path / "m.jsonl"
        train_from_seed(seed_checkpoint, metrics, nproc, flags)
    assert_matches_baseline(metrics, baseline, baseline_grad_norms, name=name, params=params_norms(baseline_metrics))


VARIANT = (
    "--position-embedding-type rope --use-rope-scaling --normalization RMSNorm --qk-layernorm --squared-relu".split()
)
"""Megatron-Core's model variants that Megatron-LM's flags turn on: per-head query/key norms (one weight that every
TP rank's heads train: its gradient is summed over TP), squared ReLU, Llama 3.1's rope scaling."""
VARIANT_LAYOUTS = {
    "variant-tp2-sequence-parallel": (2, "--tensor-model-parallel-size 2 --sequence-parallel".split()),
    "variant-pp2-vp2-dp2-distopt": (
        4,
        "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2 --use-distributed-optimizer".split(),
    ),
}


MUON = "--optimizer muon --muon-tp-mode duplicated --muon-fp32-matmul-prec high".split()
"""Megatron-Core's Muon (emerging-optimizers), in the mode that is exact across layouts: each TP rank gathers the
whole matrix and orthogonalizes it as TP 1 does (the default, blockwise, orthogonalizes each shard alone and
differs from TP 1 by design), in fp32 (medium, the default, runs Newton-Schulz in bf16, whose rounding would turn
TP's reordered sums into differences above the tolerance)."""
MUON_LAYOUTS = {
    "muon-tp2": (2, ["--tensor-model-parallel-size", "2"]),
    "muon-tp2-distributed-newton-schulz": (
        2,
        "--tensor-model-parallel-size 2 --muon-tp-mode distributed".split(),
    ),
    "muon-pp2-vp2-dp2": (
        4,
        "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2".split(),
    ),
}

FAMILIES = {
    "7-layers": (ODD_LAYERS, ODD_LAYOUTS),
    "variant": (VARIANT, VARIANT_LAYOUTS),
    "muon": (MUON, MUON_LAYOUTS),
}
"""Models other than TINY_MODEL, each with its own seed and TP1·PP1 baseline, and the layouts that must match."""


@pytest.fixture(scope="module")
def family_baselines(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Path, Path]]:
    """(seed checkpoint, baseline metrics) of a family, made once on first use."""
    made: dict[str, tuple[Path, Path]] = {}

    def get(family: str) -> tuple[Path, Path]:
        if family not in made:
            flags = FAMILIES[family][0]
            seed = tmp_path_factory.mktemp(f"seed-{family}") / "ckpt"
            run_pretrain([*TINY_MODEL, *flags, "--train-iters", "0", "--save", str(seed)])
            metrics = tmp_path_factory.mktemp(f"baseline-{family}") / "m.jsonl"
            train_from_seed(seed, metrics, 1, flags)
            made[family] = (seed, metrics)
        return made[family]

    return get


@pytest.mark.parametrize(
    ("family", "name"), [(family, name) for family, (_, layouts) in FAMILIES.items() for name in layouts]
)
def test_other_models_layout_matches_their_baseline(
    family: str, name: str, family_baselines: Callable[[str], tuple[Path, Path]], tmp_path: Path
) -> None:
    flags, layouts = FAMILIES[family]
    seed, baseline = family_baselines(family)
    if family == "variant":
        from megatron.core import dist_checkpointing

        keys = dist_checkpointing.load_tensors_metadata(str(seed / "iter_0000000"))
        assert [k for k in keys if "q_layernorm" in k] and [k for k in keys if "k_layernorm" in k]
    nproc, layout = layouts[name]
    train_from_seed(seed, tmp_path / "m.jsonl", nproc, [*flags, *layout])
    assert_matches_baseline(
        tmp_path / "m.jsonl", train_losses(baseline), grad_norms(baseline), name=name, params=params_norms(baseline)
    )
