"""The step's costs outside its microbatches (``estimate/step_overhead.py``): NCCL's latency for the bookkeeping
all-reduces, the optimizer's memory traffic, and how they grow at a fixed global batch as DP grows."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from megatron_ext.config.arguments import ModelArgs
from megatron_ext.estimate.hardware import get_profile
from megatron_ext.estimate.step_overhead import scalar_allreduce_latency, step_overhead
from megatron_ext.estimate.step_time import estimate_step_time
from megatron_ext.estimate.workload import Workload
from megatron_ext.parallel.layout import ParallelLayout

pytestmark = pytest.mark.unit

GPT3_175B = ModelArgs(num_layers=96, hidden_size=12288, num_attention_heads=96, seq_length=2048, vocab_size=51200)
RANK_PARAMETERS = 2_700_000_000
"""About GPT-3 175B's parameters over TP 8 × PP 8 (the most loaded rank holds a little more)."""


def layout(gpus: int, *, global_batch: int = 1536, distributed_optimizer: bool = True) -> ParallelLayout:
    """GPT-3 175B at TP 8, PP 8, micro-batch 1: the layout MegaScale's Megatron-LM baseline scaled."""
    return ParallelLayout(
        world_size=gpus,
        tensor_model_parallel_size=8,
        pipeline_model_parallel_size=8,
        micro_batch_size=1,
        global_batch_size=global_batch,
        num_layers=96,
        num_attention_heads=96,
        seq_length=2048,
        sequence_parallel=True,
        use_distributed_optimizer=distributed_optimizer,
        gpus_per_node=8,
    )


def test_a_scalar_allreduce_takes_nccls_tree_latency_logarithmic_in_the_nodes() -> None:
    """NCCL's cost model (src/graph/tuning.cc): LL tree ``4.4 + 2·((r/n − 1)·0.52·1.8 + ⌊log₂ n⌋·5.0)`` µs,
    LL ring ``3.6 + 2·(r − n)·0.47·1.8 + 2·(n − 1)·2.7`` µs, the faster of the two."""
    # 12,288 GPUs on 1,536 nodes: the tree, 10 levels; the ring would take over 8 ms.
    assert scalar_allreduce_latency(12288, 1536) == pytest.approx(4.4e-6 + 2 * (7 * 0.936e-6 + 10 * 5.0e-6))
    # Twice the nodes, one more level each way: +10 µs, however many GPUs.
    assert scalar_allreduce_latency(2048, 256) - scalar_allreduce_latency(1024, 128) == pytest.approx(10e-6)
    # One node: the LL ring's 14 NVLink hops beat the tree's.
    assert scalar_allreduce_latency(8, 1) == pytest.approx(3.6e-6 + 14 * 0.47e-6)
    # A few nodes with one GPU each: the ring's two network hops per node are still cheaper than the tree's.
    assert scalar_allreduce_latency(2, 2) == pytest.approx(3.6e-6 + 2 * 2.7e-6)
    assert scalar_allreduce_latency(1, 1) == 0.0


def test_a_calibrated_transport_latency_prices_the_bookkeeping_all_reduces_as_rings() -> None:
    """With ``link_latency_s`` (gloo, from --calibrate) a scalar all-reduce is a ring's 2·(r − 1) steps of it."""
    gpu = dataclasses.replace(get_profile("h100-sxm"), link_latency_s=1e-3)
    w = Workload(model=GPT3_175B, precision="bf16")
    lay = layout(64 * 4, global_batch=64)  # DP 4, PP 8 on 32 nodes
    without = step_overhead(w, lay, dataclasses.replace(gpu, link_latency_s=None), gpus_per_node=8, rank_parameters=1)
    calibrated = step_overhead(w, lay, gpu, gpus_per_node=8, rank_parameters=1)
    # Grad norm over the world (256), loss over DP (4) and over PP (8).
    assert calibrated.optimizer_s - without.optimizer_s == pytest.approx(2 * 255e-3, rel=1e-3)
    assert calibrated.housekeeping_s == pytest.approx(2 * 3e-3 + 2 * 7e-3, rel=1e-3)


def test_the_optimizer_streams_adam_norm_and_clip_bytes_and_zeroes_the_whole_gradient_buffer() -> None:
    """Adam 30 bytes per updated parameter, the norm's read and the clip's read and write 12 more (both sharded
    by the distributed optimizer); zeroing the gradient buffer writes all of the rank's 4-byte gradients."""
    gpu = get_profile("a100-80g")
    w = Workload(model=GPT3_175B, precision="bf16")
    for gpus in (256, 12288):
        lay = layout(gpus)
        dp = lay.dp
        o = step_overhead(w, lay, gpu, gpus_per_node=8, rank_parameters=RANK_PARAMETERS)
        # The gradient norm's all-reduce over the whole world.
        assert o.optimizer_s == pytest.approx(
            RANK_PARAMETERS / dp * (30 + 12) / gpu.memory_bandwidth + scalar_allreduce_latency(gpus, gpus // 8)
        )
        # Zeroing is not sharded; the loss is reduced over DP (one GPU a node: TP fills it), then over PP.
        loss = scalar_allreduce_latency(dp, dp) + scalar_allreduce_latency(8, 8)
        assert o.housekeeping_s == pytest.approx(RANK_PARAMETERS * 4 / gpu.memory_bandwidth + loss)
    # fp16 adds the found-inf all-reduce over the same (world) group; bf16 gradient buffers their cast to fp32.
    lay = layout(12288)
    bf16 = step_overhead(w, lay, gpu, gpus_per_node=8, rank_parameters=RANK_PARAMETERS)
    fp16 = step_overhead(
        Workload(model=GPT3_175B, precision="fp16"), lay, gpu, gpus_per_node=8, rank_parameters=RANK_PARAMETERS
    )
    assert fp16.optimizer_s - bf16.optimizer_s == pytest.approx(scalar_allreduce_latency(12288, 1536))
    cast = step_overhead(
        Workload(model=GPT3_175B, precision="bf16", grad_reduce_in_bf16=True),
        lay,
        gpu,
        gpus_per_node=8,
        rank_parameters=RANK_PARAMETERS,
    )
    assert cast.optimizer_s - bf16.optimizer_s == pytest.approx(RANK_PARAMETERS / lay.dp * 6 / gpu.memory_bandwidth)
    # Without the distributed optimizer the norm is reduced over TP × PP only, and every parameter is updated.
    plain = step_overhead(
        w, layout(12288, distributed_optimizer=False), gpu, gpus_per_node=8, rank_parameters=RANK_PARAMETERS
    )
    assert plain.optimizer_s == pytest.approx(
        RANK_PARAMETERS * 42 / gpu.memory_bandwidth + scalar_allreduce_latency(64, 8)
    )


def test_at_a_fixed_global_batch_the_per_step_costs_grow_with_dp_but_stay_milliseconds() -> None:
    """GPT-3 175B, batch 1536, TP 8 × PP 8 on 256 to 12,288 A100s (DP 4 to 192): the per-step costs outside
    the microbatches that do not shrink with DP (zeroing the buffer, the bookkeeping all-reduces) grow with the
    node count, logarithmically, and at 12,288 GPUs are a few milliseconds: against the several seconds of a
    step they cannot make the estimate much slower at scale."""
    gpu = get_profile("a100-80g")
    w = Workload(model=GPT3_175B, precision="bf16", overlap_grad_reduce=True, overlap_param_gather=True)
    fixed = []
    for gpus in (256, 1024, 3072, 12288):
        lay = layout(gpus)
        t = estimate_step_time(w, lay, gpu, gpus_per_node=8, rank_parameters=RANK_PARAMETERS)
        microbatches_and_gradients = t.compute_s + t.tp_comm_s + t.cp_comm_s + t.bubble_s + t.pp_comm_s + t.dp_comm_s
        sharded = RANK_PARAMETERS / lay.dp * 42 / gpu.memory_bandwidth  # Adam, norm and clip on the shard
        fixed.append(t.step_s - microbatches_and_gradients - sharded)
    zeroing = RANK_PARAMETERS * 4 / gpu.memory_bandwidth
    assert all(a < b for a, b in itertools.pairwise(fixed))
    # The three all-reduces' latency (world, DP, PP) at 1,536 nodes: NCCL's trees, 118 + 74 + 34 µs.
    latency = fixed[-1] - zeroing
    assert latency == pytest.approx(
        scalar_allreduce_latency(12288, 1536) + scalar_allreduce_latency(192, 192) + scalar_allreduce_latency(8, 8)
    )
    assert 150e-6 < latency < 250e-6
    # All of it under two thousandths of the step (3.5 s at 12,288 GPUs).
    assert fixed[-1] < 2e-3 * t.step_s
