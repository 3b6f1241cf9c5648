"""``--fp8-format`` in the calculator: the layers' GEMMs at the GPU's FP8 peak, the casts as memory traffic, the
logits and the attention core in the training precision; refused on a GPU without FP8; emitted in the flags."""

from __future__ import annotations

import dataclasses
import io
import json
import shlex

import pytest

from megatron_ext.cli.layout import main as layout_tool
from megatron_ext.config.arguments import ModelArgs
from megatron_ext.config.layout_flags import model_layout_facts
from megatron_ext.config.training_config import parse_args
from megatron_ext.estimate.flops import attention_core_forward_flops, layer_forward_flops
from megatron_ext.estimate.fp8 import fp8_cast_bytes
from megatron_ext.estimate.hardware import get_profile
from megatron_ext.estimate.search import Cluster, evaluate, pretrain_flags
from megatron_ext.estimate.step_time import unit_times
from megatron_ext.estimate.workload import Workload
from megatron_ext.parallel.layout import ParallelLayout
from tests.estimate.published import GPT3_175B, llama, nemotron

pytestmark = pytest.mark.unit

LLAMA = ModelArgs(
    num_layers=4, hidden_size=4096, num_attention_heads=32, group_query_attention=True, num_query_groups=8,
    ffn_hidden_size=14336, swiglu=True, normalization="RMSNorm", position_embedding_type="rope",
    disable_bias_linear=True, untie_embeddings_and_output_weights=True, seq_length=8192, vocab_size=128256,
    hidden_dropout=0.0, attention_dropout=0.0,
)  # fmt: skip


def layout_of(*, tp: int, pp: int, world: int) -> ParallelLayout:
    return ParallelLayout(
        world_size=world,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        global_batch_size=8,
        **model_layout_facts(LLAMA),
    )


# Per token of one layer of LLAMA at TP 4, in elements: the tensors local to a rank (the projection's input, 32 heads
# × 128 / 4, and FC2's, 14336 / 4, forward; QKV's output gradient, (32 + 2 × 8) × 128 / 4, and SwiGLU FC1's,
# 2 × 14336 / 4, backward) and the hidden-wide ones SP gathers (QKV's and FC1's inputs forward, the projection's
# and FC2's output gradients backward: 4096, 4096 / 4 a rank with SP).
LOCAL_FORWARD, LOCAL_BACKWARD, HIDDEN = 1024 + 3584, 1536 + 7168, 4096


@pytest.mark.parametrize(
    ("recipe", "sp", "forward", "backward"),
    [
        # delayed: the norm writes FP8, only its transpose (2) is added; a local tensor read once, written in both
        # layouts (2 + 2); a gathered gradient cast on the rank's quarter in one layout (2 + 1), transposed whole.
        ("delayed", True, LOCAL_FORWARD * 4 + 2 * HIDDEN * 2, LOCAL_BACKWARD * 4 + 2 * (HIDDEN / 4 * 3 + HIDDEN * 2)),
        ("delayed", False, LOCAL_FORWARD * 4 + 2 * HIDDEN * 2, LOCAL_BACKWARD * 4 + 2 * HIDDEN * 4),
        # tensorwise: every tensor but the norm's output read once more for its amax (2); the norm writes bf16 and
        # a cast follows.
        ("tensorwise", True, LOCAL_FORWARD * 6 + 2 * (HIDDEN / 4 * 3 + HIDDEN * 2),
         LOCAL_BACKWARD * 6 + 2 * (HIDDEN / 4 * 5 + HIDDEN * 2)),
        ("tensorwise", False, LOCAL_FORWARD * 6 + 2 * HIDDEN * 4, LOCAL_BACKWARD * 6 + 2 * HIDDEN * 6),
        # blockwise: both layouts cast from the rank's share and gathered, nothing transposed after.
        ("blockwise", True, LOCAL_FORWARD * 4 + 2 * HIDDEN / 4 * 4, LOCAL_BACKWARD * 4 + 2 * HIDDEN / 4 * 4),
        ("blockwise", False, LOCAL_FORWARD * 4 + 2 * HIDDEN * 4, LOCAL_BACKWARD * 4 + 2 * HIDDEN * 4),
    ],
)  # fmt: skip
def test_each_recipe_counts_the_casts_its_kernels_do(recipe: str, sp: bool, forward: float, backward: float) -> None:
    """Transformer Engine's kernels by quantizer (``fp8.fp8_cast_bytes``), bf16 (2 bytes) into FP8 (1 byte a
    layout), for two sequences of 8192 tokens."""
    workload = Workload(model=LLAMA, fp8_format="hybrid", fp8_recipe=recipe)
    tokens = 2 * 8192
    got = fp8_cast_bytes(workload, sequences=2, seq_length=8192, tp=4, sequence_parallel=sp)
    assert got == (tokens * forward, tokens * backward)
    assert fp8_cast_bytes(Workload(model=LLAMA), sequences=2, seq_length=8192, tp=4) == (0.0, 0.0)


def test_the_recipe_prices_one_layout_reaches_pretrain_gpt_and_mxfp8_is_refused_on_hopper() -> None:
    base = ("--model llama3.1-70b --gpus 64 --gpu h100-sxm --global-batch-size 128 --bf16 --fp8-format hybrid "
            "--tensor-model-parallel-size 4 --pipeline-model-parallel-size 8 --virtual-pipeline-model-parallel-size 5 "
            "--sequence-parallel --use-distributed-optimizer --json").split()  # fmt: skip
    steps = {}
    for recipe in ("delayed", "blockwise", "tensorwise"):
        out = io.StringIO()
        assert layout_tool([*base, "--fp8-recipe", recipe], stdout=out, stderr=io.StringIO()) == 0
        record = json.loads(out.getvalue())["layouts"][0]
        steps[recipe] = record["step_time_s"]
        cfg = parse_args([*shlex.split(record["pretrain_flags"]), "--mock-data"], world_size=64)
        assert Workload.of_config(cfg).fp8_recipe == recipe
    # Bytes beside GEMM-bound layers, a percent or less: blockwise moves the fewest (no transpose after a gather),
    # tensorwise the most (its amax passes).
    assert steps["blockwise"] < steps["delayed"] < steps["tensorwise"] < 1.03 * steps["delayed"]
    err = io.StringIO()
    assert layout_tool([*base, "--fp8-recipe", "mxfp8"], stdout=io.StringIO(), stderr=err) == 2
    assert "--fp8-recipe mxfp8: the h100-sxm profile's tensor cores have no MXFP8" in err.getvalue()


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_only_the_layer_gemms_move_to_the_fp8_peak(recompute: str) -> None:
    # No shape losses (one multiprocessor: whole waves; no depth loss): the GEMMs' FLOPs at the plain rates.
    gpu = dataclasses.replace(get_profile("h100-sxm"), sms=1, gemm_depth_half=0.0)
    layout = layout_of(tp=4, pp=1, world=8)
    bf16 = Workload(model=LLAMA, recompute_granularity=recompute)
    fp8 = dataclasses.replace(bf16, fp8_format="e4m3")
    plain, faster = (unit_times(w, layout, gpu, gpus_per_node=8) for w in (bf16, fp8))
    assert faster.output_compute_s == plain.output_compute_s  # the logits stay in bf16
    assert faster.layer_tp_s == plain.layer_tp_s
    # The layer's GEMMs (not the attention core): three passes, four with full recompute.
    passes = 4 if recompute == "full" else 3
    gemm = passes * (layer_forward_flops(LLAMA, sequences=1) - attention_core_forward_flops(LLAMA, sequences=1)) / 4
    forward, backward = fp8_cast_bytes(fp8, sequences=1, seq_length=8192, tp=4)
    casts = backward + forward * (2 if recompute == "full" else 1)
    assert gpu.peak_flops_fp8 is not None and gpu.fp8_compute_efficiency is not None
    saved = gemm / (gpu.peak_flops * gpu.compute_efficiency) - gemm / (gpu.peak_flops_fp8 * gpu.fp8_compute_efficiency)
    added = casts / (gpu.memory_bandwidth * gpu.memory_efficiency)
    assert faster.layer_compute_s == pytest.approx(plain.layer_compute_s - saved + added, rel=1e-12)
    assert 0.5 < faster.layer_compute_s / plain.layer_compute_s < 0.85  # the attention core bounds the gain


def test_a_gpu_without_fp8_is_refused_and_the_flag_is_emitted_for_pretrain_gpt() -> None:
    base = ["--model", "llama3.1-8b", "--gpus", "64", "--global-batch-size", "128", "--bf16", "--fp8-format", "hybrid"]
    err = io.StringIO()
    assert layout_tool([*base, "--gpu", "a100-80g"], stdout=io.StringIO(), stderr=err) == 2
    assert "--fp8-format hybrid: the a100-80g profile has no FP8 tensor cores" in err.getvalue()
    workload = Workload(model=LLAMA, precision="bf16", fp8_format="hybrid")
    layout = layout_of(tp=2, pp=2, world=4)
    flags = shlex.split(" ".join(pretrain_flags(workload, layout)))
    assert flags[-2:] == ["--fp8-format", "hybrid"]
    cfg = parse_args([*flags, "--mock-data"], world_size=4)
    assert Workload.of_config(cfg).fp8_format == "hybrid"


def test_fp8_ranks_layouts_faster_where_the_gemms_dominate() -> None:
    out = io.StringIO()
    flags = ["--model", "llama3.1-70b", "--gpus", "256", "--global-batch-size", "512", "--bf16", "--json"]
    assert layout_tool([*flags, "--gpu", "h100-sxm", "--top", "1"], stdout=out, stderr=io.StringIO()) == 0
    fp8 = io.StringIO()
    assert layout_tool([*flags, "--gpu", "h100-sxm", "--top", "1", "--fp8-format", "e4m3"], stdout=fp8) == 0
    bf16_step = json.loads(out.getvalue())["layouts"][0]["step_time_s"]
    fp8_step = json.loads(fp8.getvalue())["layouts"][0]["step_time_s"]
    assert 1.2 < bf16_step / fp8_step < 2.0


# NVIDIA DGX Cloud Benchmarking recipes (github NVIDIA/dgxc-benchmarking, release v24.11.1, commit 35a9aecc):
# the 'Expected Performance' tables of llama3.1/README_{8b,70b,405b}.md, nemotron/README_{15b,340b}.md and
# nemo_megatron/README_175b.md: the same model and layout on DGX H100 in BF16 and in FP8 (hybrid, delayed
# scaling, the FP8 weights gathered in FP8: +model.fp8_params; NeMo 24.09 / 24.05), step times in seconds at the
# smallest GPU count of each table, run as the BF16 rows of tests/estimate/published.py assume. The FP8 GEMMs'
# share of the FP8 peak is fitted to the ratios of the calibration models (Llama 3.1 8B, 405B and its proxy,
# Nemotron-4 340B); the other three validate.
# name, model, GPUs, TP, PP, VP, CP, global batch, micro-batch, recompute, BF16 step s, FP8 step s
DGXC_PAIRS = [
    ("Llama 3.1 8B", llama(32, 4096, 14336, 32, 8), 8, 1, 1, 1, 2, 128, 1, "none", 12.91, 9.67),
    ("Llama 3.1 70B", llama(80, 8192, 28672, 64, 8), 64, 4, 4, 5, 2, 128, 1, "none", 14.72, 11.01),
    ("Llama 3.1 405B, 7-layer proxy", llama(7, 16384, 53248, 128, 16), 32, 8, 1, 1, 2, 126, 1, "none", 8.85, 5.80),
    ("Llama 3.1 405B", llama(126, 16384, 53248, 128, 16), 576, 8, 9, 7, 2, 252, 1, "none", 17.20, 11.24),
    ("Nemotron-4 15B", nemotron(32, 6144, 48), 16, 4, 1, 1, 1, 64, 4, "none", 2.83, 2.08),
    ("Nemotron-4 340B", nemotron(96, 18432, 96), 128, 8, 8, 12, 1, 32, 1, "selective", 4.61, 3.16),
    ("GPT-3 175B", GPT3_175B, 128, 4, 8, 12, 1, 256, 1, "none", 8.91, 5.92),
]
FP8_SPEEDUP_TOLERANCE = 0.10
"""As every validation row of the time model: within 10% (the calibration pairs within 3%)."""


@pytest.mark.parametrize("row", DGXC_PAIRS, ids=[row[0] for row in DGXC_PAIRS])
def test_the_fp8_speedup_holds_against_published_h100_pairs(row: tuple) -> None:
    name, model, gpus, tp, pp, vp, cp, batch, micro, recompute, bf16_s, fp8_s = row
    layout = ParallelLayout(
        world_size=gpus, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vp if vp > 1 else None, context_parallel_size=cp,
        sequence_parallel=tp > 1, use_distributed_optimizer=True, micro_batch_size=micro, global_batch_size=batch,
        gpus_per_node=8, **model_layout_facts(model),
    )  # fmt: skip
    cluster = Cluster(gpus=gpus, gpus_per_node=8, gpu=get_profile("h100-sxm"))
    # The Llama and Nemotron recipes fuse the cross entropy, the GPT-3 one does not (published.dgxc_rows).
    model = dataclasses.replace(model, cross_entropy_loss_fusion=not name.startswith("GPT-3"))
    bf16 = Workload(model=model, recompute_granularity=recompute, overlap_grad_reduce=True, overlap_param_gather=True,
                    tp_comm_overlap=tp > 1, grad_reduce_in_bf16=True)  # fmt: skip
    fp8 = dataclasses.replace(bf16, fp8_format="hybrid", fp8_param_gather=True)
    predicted = evaluate(bf16, layout, cluster).time.step_s / evaluate(fp8, layout, cluster).time.step_s
    assert predicted / (bf16_s / fp8_s) - 1 == pytest.approx(0, abs=FP8_SPEEDUP_TOLERANCE), name
