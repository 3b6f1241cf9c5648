"""The calculator against published measurements: Table 1 of Narayanan et al. 2021, and the 1T search time.

Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM" (arXiv 2104.04473), Table 1: GPT models of 1.7B to
1T parameters on Selene (DGX A100 80GB, 8× HDR InfiniBand per node), sequence
2048, vocabulary 51,200, fp16, full activation recomputation; the achieved
teraFLOP/s per GPU count the recomputation's extra forward pass
(``96·B·s·l·h²·(1 + s/6h + V/16lh)``). The micro-batch sizes, virtual stages
and DDP implementation of each row are those of Megatron-LM's reproduction
script ``examples/sc21/run_table_1.sh``: ``DDP=torch`` (gradient all-reduce
overlapped with the backward pass) for the PP = 1 rows, Megatron's own DDP
(not overlapped) otherwise; p2p with the paper's scatter/gather optimisation.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, replace

import pytest

from megatron_ext.config.arguments import ModelArgs
from megatron_ext.config.layout import ParallelLayout
from megatron_ext.config.presets import get_preset
from megatron_ext.estimate.hardware import A100_COMPUTE_EFFICIENCY, get_profile
from megatron_ext.estimate.search import Cluster, LayoutEstimate, evaluate, search
from megatron_ext.estimate.workload import Workload
from tests.conftest import REPO

pytestmark = pytest.mark.unit


@dataclass(frozen=True)
class Table1Row:
    billions: float
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    gpus: int
    batch: int
    tflops: float
    """Achieved teraFLOP/s per GPU (Table 1)."""
    peak_share: float
    """Percentage of theoretical peak FLOP/s (Table 1)."""
    micro_batch: int
    """run_table_1.sh MBS."""
    vp: int
    """Virtual stages from run_table_1.sh --num-layers-per-virtual-pipeline-stage (1: none)."""
    torch_ddp: bool
    """run_table_1.sh DDP=torch (overlapped all-reduce)."""


TABLE_1 = [
    Table1Row(1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 0.44, 16, 1, True),
    Table1Row(3.6, 32, 3072, 30, 2, 1, 64, 512, 138, 0.44, 16, 1, True),
    Table1Row(7.5, 32, 4096, 36, 4, 1, 128, 512, 142, 0.46, 16, 1, True),
    Table1Row(18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, 0.43, 8, 1, True),
    Table1Row(39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, 0.44, 4, 1, False),
    Table1Row(76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, 0.45, 2, 3, False),
    Table1Row(145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, 0.47, 2, 2, False),
    Table1Row(310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, 0.50, 1, 2, False),
    Table1Row(529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, 0.52, 1, 3, False),
    Table1Row(1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, 0.52, 1, 1, False),
]
TOLERANCE = 0.15


def table1_estimate(row: Table1Row, compute_efficiency: float | None = None) -> LayoutEstimate:
    """The calculator's estimate of one Table 1 row on the a100-80g profile."""
    model = ModelArgs(
        num_layers=row.layers,
        hidden_size=row.hidden,
        num_attention_heads=row.heads,
        seq_length=2048,
        max_position_embeddings=2048,
        vocab_size=51200,
        attention_backend="unfused",  # 2021: Megatron's fused scale-mask-softmax, scores in memory
    )
    workload = Workload(
        model=model,
        precision="fp16",
        recompute_granularity="full",
        overlap_grad_reduce=row.torch_ddp,
        p2p_scatter_gather=True,
    )
    gpu = get_profile("a100-80g")
    if compute_efficiency is not None:
        gpu = replace(gpu, compute_efficiency=compute_efficiency)
    layout = ParallelLayout(
        world_size=row.gpus,
        tensor_model_parallel_size=row.tp,
        pipeline_model_parallel_size=row.pp,
        virtual_pipeline_model_parallel_size=row.vp if row.vp > 1 else None,
        micro_batch_size=row.micro_batch,
        global_batch_size=row.batch,
        num_layers=row.layers,
        num_attention_heads=row.heads,
        seq_length=2048,
        gpus_per_node=8,
    )
    return evaluate(workload, layout, Cluster(gpus=row.gpus, gpus_per_node=8, gpu=gpu))


@pytest.mark.parametrize("row", TABLE_1, ids=[f"{r.billions}B" for r in TABLE_1])
def test_table1_layout_is_valid_fits_and_matches_the_measured_throughput(row: Table1Row) -> None:
    estimate = table1_estimate(row)
    assert estimate.layout.dp == row.gpus // (row.tp * row.pp)
    assert estimate.fits, f"{row.billions}B needs {estimate.memory.total_bytes / 2**30:.1f} GiB"
    # The paper's parameter count (Eq. 2: 12lh²(1 + 13/12h + (V + s)/12lh)) is what the rows are named by.
    assert estimate.time.model_flops > 0
    predicted = estimate.hardware_tflops_per_gpu
    assert predicted == pytest.approx(row.tflops, rel=TOLERANCE), f"{row.billions}B: {predicted:.1f} vs {row.tflops}"
    # The same share of the 312 TFLOP/s peak the paper reports (its "% of peak" column).
    assert predicted / 312 == pytest.approx(row.peak_share, rel=TOLERANCE + 0.02)


def test_table1_rows_are_the_shapes_the_paper_counts() -> None:
    """Each row's shape gives its parameter count by the paper's Eq. 2, and by the calculator's exact count."""
    for row in TABLE_1:
        layers, h, v, s = row.layers, row.hidden, 51200, 2048
        paper = 12 * layers * h * h * (1 + 13 / (12 * h) + (v + s) / (12 * layers * h))
        assert round(paper / 1e9, 1) == row.billions
        workload = table1_estimate(row)
        exact = (
            Workload(
                model=ModelArgs(
                    num_layers=layers, hidden_size=h, num_attention_heads=row.heads, seq_length=s, vocab_size=v
                )
            )
            .parameter_counts(tp=1, pp=1)
            .total
        )
        assert exact == pytest.approx(paper, rel=1e-3)
        assert workload.layout.world_size == row.gpus


def test_compute_efficiency_is_the_minimax_fit_to_table1() -> None:
    """The shipped constant is (to 0.005) the value that minimises the largest Table 1 error."""

    def worst(eff: float) -> float:
        return max(abs(table1_estimate(r, eff).hardware_tflops_per_gpu / r.tflops - 1) for r in TABLE_1)

    grid = [round(0.50 + 0.005 * i, 3) for i in range(41)]
    best = min(grid, key=worst)
    assert abs(best - A100_COMPUTE_EFFICIENCY) <= 0.0051, f"refit: best {best}, shipped {A100_COMPUTE_EFFICIENCY}"
    assert worst(A100_COMPUTE_EFFICIENCY) < 0.10


def test_the_calculators_first_choice_for_the_1t_row_is_the_papers_tp_and_pp() -> None:
    """Searching the 1T row's 3072 GPUs with the paper's settings picks its TP 8 × PP 64."""
    row = TABLE_1[-1]
    base = table1_estimate(row)
    result = search(
        replace(
            Workload(model=ModelArgs(**get_preset("megatron-1t").model_flags()), precision="fp16"),
            recompute_granularity="full",
        ),
        base.cluster,
        global_batch_size=row.batch,
    )
    best = result.fitting[0].layout
    assert (best.tp, best.pp, best.dp) == (row.tp, row.pp, row.gpus // (row.tp * row.pp))


def _search_1t(granularity: str, sequence_parallel: bool) -> float:
    workload = Workload(
        model=ModelArgs(**get_preset("megatron-1t").model_flags()), precision="bf16", recompute_granularity=granularity
    )
    cluster = Cluster(gpus=3072, gpus_per_node=8, gpu=get_profile("a100-80g"))
    start = time.perf_counter()
    result = search(workload, cluster, global_batch_size=3072, sequence_parallel=sequence_parallel)
    elapsed = time.perf_counter() - start
    assert result.estimates and result.candidates >= len(result.estimates)
    return elapsed


@pytest.mark.parametrize("granularity", ["none", "selective", "full"])
def test_full_1t_search_on_3072_gpus_is_fast(granularity: str) -> None:
    assert _search_1t(granularity, sequence_parallel=True) < 2.0
    assert _search_1t(granularity, sequence_parallel=False) < 2.0


def test_full_1t_search_from_the_command_line_under_two_seconds() -> None:
    start = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "tools" / "layout.py"),
            "--gpus",
            "3072",
            "--gpu",
            "a100-80g",
            "--model",
            "megatron-1t",
            "--bf16",
            "--recompute-granularity",
            "full",
            "--recompute-method",
            "uniform",
            "--use-distributed-optimizer",
            "--sequence-parallel",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    elapsed = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr
    assert elapsed < 2.0, f"{elapsed:.2f} s"
    assert '"layouts"' in proc.stdout
