"""What a training step costs besides its microbatches: NCCL's collective latencies, the optimizer step's memory
traffic and the step's latency-bound bookkeeping collectives.

**NCCL's latency model.** NCCL chooses, per collective and size, the algorithm and protocol its own cost model
predicts fastest (``src/graph/tuning.cc``, ``ncclTopoTuneModel``: a base latency per algorithm and protocol plus
a hardware latency per hop inside a node and over the network; the tables at NVIDIA/nccl commit 01afd20a).
Large data-parallel buckets go by ring with the Simple protocol (``ring_latency``): ``r − 1`` steps for a
reduce-scatter or all-gather, ``n − 1`` of them over the network. A scalar all-reduce is latency-bound and NCCL
takes the faster of the low-latency (LL) tree and ring (``scalar_allreduce_latency``):

* tree (double binary tree, NCCL 2.4): ``4.4 + 2·((r/n − 1)·0.52·1.8 + ⌊log₂ n⌋·5.0)`` µs, up and down the tree;
* ring: ``3.6 + 2·(r − n)·0.47·1.8 + 2·(n − 1)·2.7`` µs;

for ``r`` ranks on ``n`` nodes (the ``1.8``: NCCL's LL penalty on NVLink hops when the job spans nodes). The tree
grows with the logarithm of the node count, so a scalar all-reduce over 12,288 GPUs (1,536 nodes of 8) takes
``4.4 + 2·(7·0.94 + 10·5.0) ≈ 118 µs``; the ring would take 8 ms.

**Bookkeeping collectives** of one step (``megatron_ext/training/loop.py`` and Megatron-Core's optimizer), each
followed by a host synchronisation (``.item()``), so none overlaps anything:

* the loss: an all-reduce over DP × CP on the last pipeline stage, then one over the pipeline group
  (``Trainer._reduce_loss``);
* the gradient norm: an all-reduce of the sum of squares over the gradient-statistics group, the whole world with
  the distributed optimizer (each rank holds a shard), else the model-parallel group TP × PP
  (``get_grad_stats_parallel_group``, ``get_grad_norm_fp32``);
* fp16 only: the loss scaler's found-inf flag, an all-reduce (max) over the same group
  (``_unscale_main_grads_and_check_for_nan``).

**The optimizer step's memory traffic** (HBM-bound multi-tensor kernels), per parameter the rank updates (all of
its parameters, or 1/(DP × CP) of them with the distributed optimizer):

* Adam: 30 bytes, fp32 master weights and both moments read and written (4 + 4 + 16), the fp32 gradient read
  (4), the bf16 weights written (2); 28 in fp32, which has no separate copy to write;
* the gradient norm reads the fp32 main gradients (4 bytes) and the clipping scales them in place (4 + 4):
  with Transformer Engine's multi-tensor kernels Megatron-Core applies the clip factor, clamped to 1, every step
  (``clip_grad_by_total_norm_fp32``; with apex's, only when the norm exceeds ``--clip-grad``);
* with ``--grad-reduce-in-bf16`` the bf16 gradients are cast to fp32 main gradients first (2 + 4).

Outside the optimizer, every step zeroes the whole gradient buffer (``zero_grad_buffer``, ``gradient_bytes`` per
parameter of the rank, not sharded).

At 12,288 GPUs all of these together are milliseconds a step (``docs/layout-model.md``): they grow with the node
count, but only logarithmically, and the memory traffic does not grow at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from megatron_ext.estimate.hardware import GpuProfile
from megatron_ext.estimate.workload import Workload
from megatron_ext.parallel.layout import ParallelLayout

NCCL_RING_LATENCY_S = 8.4e-6
"""NCCL's base latency of a ring collective (Simple protocol), in its own cost model (``src/graph/tuning.cc``,
``baseLat``)."""
NCCL_RING_STEP_LATENCY_S = {"nvlink": 3.4e-6, "network": 9.6e-6}
"""NCCL's latency per ring step inside a node (NVLink) and between nodes (``hwLat``, Ring/Simple)."""
NCCL_LL_BASE_LATENCY_S = {"tree": 4.4e-6, "ring": 3.6e-6}
"""NCCL's base latency of the low-latency (LL) protocol's tree and ring (``baseLat``, Tree/LL and Ring/LL)."""
NCCL_LL_HOP_LATENCY_S = {
    ("tree", "nvlink"): 0.52e-6,
    ("tree", "network"): 5.0e-6,
    ("ring", "nvlink"): 0.47e-6,
    ("ring", "network"): 2.7e-6,
}
"""NCCL's LL latency per hop inside a node (NVLink) and between nodes (``hwLat``)."""
NCCL_LL_MULTINODE_NVLINK_FACTOR = 1.8
"""NCCL's penalty on the LL protocol's NVLink hops when the communicator spans nodes (``intraLat *= 1.8``)."""

ADAM_BYTES = {True: 30, False: 28}
"""Bytes Adam streams per parameter it updates, in mixed precision (True) and in fp32 (module docstring)."""
GRAD_NORM_AND_CLIP_BYTES = 4 + 8
"""The gradient norm's read of an fp32 main gradient and the clipping's read and write of it."""
BF16_GRAD_TO_MAIN_BYTES = 2 + 4
"""``--grad-reduce-in-bf16``: a bf16 gradient read, its fp32 main gradient written."""


def ring_latency(ranks: int, nodes: int) -> float:
    """Latency of one ring reduce-scatter or all-gather over ``ranks`` GPUs on ``nodes`` nodes, as NCCL models it:
    the base latency, then ``ranks − 1`` steps, ``nodes − 1`` of them over the network."""
    if ranks <= 1:
        return 0.0
    inter = max(nodes, 1) - 1
    steps = ranks - 1
    return (
        NCCL_RING_LATENCY_S
        + (steps - inter) * NCCL_RING_STEP_LATENCY_S["nvlink"]
        + inter * NCCL_RING_STEP_LATENCY_S["network"]
    )


def scalar_allreduce_latency(ranks: int, nodes: int) -> float:
    """Time of an all-reduce of a few bytes over ``ranks`` GPUs on ``nodes`` nodes: NCCL's LL tree or LL ring,
    whichever its cost model finds faster (module docstring)."""
    if ranks <= 1:
        return 0.0
    nodes = max(1, min(nodes, ranks))
    multinode = NCCL_LL_MULTINODE_NVLINK_FACTOR if nodes > 1 else 1.0
    per_node = ranks / nodes
    tree = NCCL_LL_BASE_LATENCY_S["tree"] + 2 * (
        (per_node - 1) * NCCL_LL_HOP_LATENCY_S[("tree", "nvlink")] * multinode
        + math.floor(math.log2(nodes)) * NCCL_LL_HOP_LATENCY_S[("tree", "network")]
    )
    ring = (
        NCCL_LL_BASE_LATENCY_S["ring"]
        + 2 * (ranks - nodes) * NCCL_LL_HOP_LATENCY_S[("ring", "nvlink")] * multinode
        + 2 * (nodes - 1) * NCCL_LL_HOP_LATENCY_S[("ring", "network")]
    )
    return min(tree, ring)


def group_nodes(ranks: int, stride: int, gpus_per_node: int) -> int:
    """Nodes a group of ``ranks`` spans whose members are ``stride`` ranks apart (Megatron-Core's order
    tp-cp-dp-pp places every group so)."""
    per_node = max(1, min(ranks, gpus_per_node // max(stride, 1)))
    return math.ceil(ranks / per_node)


def _allreduce(ranks: int, nodes: int, gpu: GpuProfile) -> float:
    """A scalar all-reduce: NCCL's latency, or with a calibrated transport latency (gloo) a ring's ``2·(r − 1)``
    steps of it."""
    if gpu.link_latency_s is not None:
        return 2 * (ranks - 1) * gpu.link_latency_s if ranks > 1 else 0.0
    return scalar_allreduce_latency(ranks, nodes)


@dataclass(frozen=True)
class StepOverhead:
    """The per-step costs outside the microbatches, seconds."""

    optimizer_s: float
    """``optimizer.step()``: its memory traffic and its gradient-norm (and fp16 found-inf) all-reduces."""
    housekeeping_s: float
    """Zeroing the gradient buffer and the loss's all-reduces."""


def step_overhead(
    workload: Workload, layout: ParallelLayout, gpu: GpuProfile, *, gpus_per_node: int, rank_parameters: int
) -> StepOverhead:
    """The optimizer step and the step's bookkeeping for ``layout`` (module docstring; ``rank_parameters``: the
    parameters of the most loaded rank)."""
    t, cp, dp, pp = layout.tp, layout.cp, layout.dp, layout.pp
    world = t * cp * dp * pp
    world_nodes = math.ceil(world / gpus_per_node)
    sharded = layout.use_distributed_optimizer
    updated = rank_parameters / (dp * cp if sharded else 1)

    main_grad_bytes = GRAD_NORM_AND_CLIP_BYTES + (BF16_GRAD_TO_MAIN_BYTES if workload.grad_reduce_in_bf16 else 0)
    memory_s = updated * (ADAM_BYTES[workload.mixed_precision] + main_grad_bytes) / gpu.memory_bandwidth

    if sharded:
        stats = _allreduce(world, world_nodes, gpu)
    else:
        # TP ranks are neighbours, the pipeline's stages TP × CP × DP ranks apart.
        stats = _allreduce(t * pp, group_nodes(pp, t * cp * dp, gpus_per_node) * math.ceil(t / gpus_per_node), gpu)
    stats_collectives = 2 if workload.precision == "fp16" else 1

    loss = _allreduce(dp * cp, group_nodes(dp * cp, t, gpus_per_node), gpu) + _allreduce(
        pp, group_nodes(pp, t * cp * dp, gpus_per_node), gpu
    )
    zero_s = rank_parameters * workload.gradient_bytes / gpu.memory_bandwidth
    return StepOverhead(optimizer_s=memory_s + stats_collectives * stats, housekeeping_s=zero_s + loss)
