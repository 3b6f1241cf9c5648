"""Estimated time of one training step: compute, pipeline bubble, exposed communication.

For a layout TP ``t`` × PP ``p`` × VP ``v`` × DP with ``m`` microbatches of
``b`` sequences (all formulas documented with their sources in
``docs/layout-model.md``):

**Compute.** FLOPs of one microbatch on one GPU of every pipeline stage:
its layers (``ParallelLayout.stages``: ``l/p`` with an even split) and, on the
last stage, the logits, each with Megatron-LM's
counts (``flops.py``: a layer's forward is ``4·b·s·h²·(attention + MLP)``
terms, the logits' ``2·b·s·h·V``; backward is twice the forward) plus what
recomputation adds (full: another forward of every layer; selective: the
attention core's forward, ``4·b·s²·n·d``), divided by ``t``. Time is the GEMMs'
FLOPs over ``peak × compute_efficiency`` of the GPU profile, fused (flash)
attention's over ``peak × attention_efficiency`` (unfused, its batched GEMMs run
at ``compute_efficiency``), plus the memory-bound element-wise kernels at
``memory_efficiency`` of the HBM bandwidth (the three constants are fitted to
published runs: ``docs/layout-model.md``): per layer forward the two norms read
and write ``s·b·h`` (``4·e·sbh`` bytes, ``e`` bytes per element), the two fused
bias-dropout-adds read two and write one tensor plus a mask (``2·(3e + 1)·sbh``),
the activation function reads and writes the MLP width (``2e·sbf``, SwiGLU
``3e·sbf``), unfused attention's softmax and dropout read and write the scores
(``(4e + 1)·a·s²·b``); all divided by ``t`` where TP (or SP) splits them;
backward twice the forward, recomputation once more. These kernels are why
small models reach a smaller share of peak (Narayanan et al. 2021, §5.1:
larger GEMMs, super-linear scaling).

A profile calibrated on the user's runs (``calibration``) may add a layer pass's fixed overhead
(``pass_overhead_s``: kernel launches, framework dispatch) to each layer's forward and backward, and a
transport latency (``link_latency_s``) to every pipeline message and to every step of a TP or DP ring
collective (``2·(t − 1)`` for an all-reduce); the published profiles have neither.

**FP8** (``--fp8-format``, Transformer Engine): the layers' GEMMs run at the
profile's FP8 peak times the same ``compute_efficiency``; the logits GEMM and
the attention core stay in the training precision; the casts to FP8 are
element-wise bytes, by ``--fp8-recipe`` (``fp8.fp8_cast_bytes``).

**Tensor-parallel communication** (Narayanan et al. 2021, §3.3; Korthikanti
et al. 2022, §4.2.2): per layer and microbatch two all-reduces of the
``b·s·h`` activations in the forward pass and two in the backward (with
sequence parallelism an all-gather and a reduce-scatter each, the same
volume), two more when full recomputation repeats the forward. A ring
all-reduce of ``X`` bytes moves ``2·(t−1)/t·X`` per GPU over NVLink. Not
overlapped (Megatron-Core overlaps TP communication only with Transformer
Engine's userbuffers, which we do not model).

**Pipeline.** The slowest stage sets the pace: with per-microbatch stage
times ``T_r`` the step takes ``m·max T_r + (Σ T_r − max T_r)/v``; for equal
stages ``(m + (p−1)/v)·T``, the bubble ``(p−1)/(v·m)`` of the ideal ``m·T``
(Narayanan et al. 2021, §2.2). Point-to-point: every stage boundary moves
``b·s·h`` activations (``/t`` with sequence parallelism) forward and the same
gradients backward, over InfiniBand when the pipeline spans nodes; one
message takes ``x``. Interleaving multiplies these messages by ``v``
(Narayanan et al. 2021, §2.2.2), and the link is a resource
(``pipeline_p2p_exposed``):

* 1F1B (Megatron-Core sends and receives synchronously, batched): every
  transfer is exposed, ``2·(p−1)`` to fill and drain plus one exchange after
  each forward and each backward pass, ``2·m`` (``m`` when ``p = 2``, whose
  two stages are both end stages).
* Interleaved 1F1B (``overlap_p2p_comm``, on in ``model.py`` as in
  Megatron-LM): ``max(2·(p·v − 1)·x, S·x + (p − 1)·(T + 2·x) − (m + (p − 1)/v)·T)``.
  The first term is the latency of the fill and drain: a microbatch crosses
  ``p·v − 1`` stage boundaries each way, each on the critical path. The
  second is the link's throughput: the busiest rank sends ``S = 2·v·m``
  messages (``(2v − 1)·m`` when ``p = 2``) through its one NIC, which cannot
  start before the pipeline has filled nor finish before it has drained;
  what does not fit behind the compute is exposed.
* Interleaved 1F1B with ``--no-overlap-p2p-communication`` (batched, blocking,
  PP > 2): ``(2·v·m + 2·(p − 2))·x``, every chunk's pass waits for its exchange.

Both agree with an event simulation of Megatron-Core's order with one link
per rank (``tests/estimate/test_step_time.py``).

**Data parallelism.** Gradients are reduced in fp32 (``grad_reduce_in_fp32``):
an all-reduce ``2·(DP−1)/DP · 4·P`` bytes, or with the distributed optimizer
a reduce-scatter ``(DP−1)/DP · 4·P`` plus an all-gather of the bf16
parameters ``(DP−1)/DP · 2·P``, for the ``P`` parameters of the most loaded
rank. The bandwidth is NVLink when the DP group sits in one node, otherwise
the InfiniBand bandwidth of each of the group's GPUs in a node (NCCL drives
one NIC per GPU). ``--overlap-grad-reduce`` hides the reduction behind the
last microbatch's backward pass, ``--overlap-param-gather`` the all-gather
behind the first forward pass; what does not fit behind them stays exposed.

**Optimizer and bookkeeping** (``step_overhead``, with the sources). Adam streams 30 bytes per parameter it
updates (fp32 master weights and both moments read and written, the fp32 gradient read, the bf16 weights
written) at HBM bandwidth, the gradient norm and clipping 12 more; the distributed optimizer updates 1/DP.
The gradient norm's all-reduce, the loss's all-reduces and zeroing the gradient buffer are paid once a step, the
collectives at NCCL's latency (its LL tree: logarithmic in the node count).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from megatron_ext.estimate.flops import (
    attention_core_forward_flops,
    flops_per_step,
    layer_forward_flops,
)
from megatron_ext.estimate.fp8 import fp8_cast_bytes, fp8_peak
from megatron_ext.estimate.hardware import GpuProfile
from megatron_ext.estimate.kernels import (
    FORWARD_AND_BACKWARD,
    context_parallel_attention_efficiency,
    gemm_pass_efficiency,
)
from megatron_ext.estimate.memory import unfused_attention
from megatron_ext.estimate.step_overhead import ring_latency, step_overhead
from megatron_ext.estimate.workload import Workload
from megatron_ext.parallel.layout import ParallelLayout
from megatron_ext.parallel.pipeline import pipeline_bubble, stage_imbalance, zb_bubble_scale


@dataclass(frozen=True, kw_only=True)
class StepTimeEstimate:
    """Estimated time of one optimizer step and what it is made of, seconds."""

    microbatch_compute_s: float
    """Forward + backward (+ recomputation) of one microbatch on the slowest stage."""
    microbatch_tp_comm_s: float
    """Tensor-parallel collectives of one microbatch on that stage."""
    compute_s: float
    """``m`` microbatches of compute: the pipeline's ideal time without communication."""
    tp_comm_s: float
    """Tensor-parallel communication of the ``m`` microbatches."""
    bubble_s: float
    """Pipeline fill and drain: ``(p−1)/v`` microbatch stage times (times ``bubble_scale``)."""
    pp_comm_s: float
    """Exposed pipeline point-to-point transfers."""
    dp_comm_s: float
    """Exposed data-parallel gradient reduction and parameter all-gather."""
    dp_comm_total_s: float
    """The data-parallel communication before overlap."""
    optimizer_s: float
    """``optimizer.step()``: Adam's update, the gradient norm and clipping of the rank's (shard of the) parameters,
    bound by memory bandwidth, and the gradient norm's all-reduce (``step_overhead``)."""
    housekeeping_s: float = 0.0
    """The step's bookkeeping outside the microbatches and the optimizer: zeroing the gradient buffer, the loss's
    all-reduces (``step_overhead``)."""
    cp_comm_s: float = 0.0
    """Context parallelism's key/value ring exchange of the ``m`` microbatches that attention does not hide."""
    bubble_scale: float = 1.0
    """The schedule's bubble over 1F1B's (interleaved or not): 1, or a zero-bubble schedule's
    (``parallel.pipeline.zb_bubble_scale``)."""
    stage_microbatch_s: tuple[float, ...]
    """One microbatch's forward and backward (and TP communication) on every pipeline stage."""
    model_flops: float
    """Model FLOPs of the step over all GPUs (Megatron-LM's formula, no recomputation)."""
    hardware_flops: float
    """FLOPs executed including recomputation (what Narayanan et al. 2021 report)."""

    @property
    def step_s(self) -> float:
        return (
            self.compute_s
            + self.tp_comm_s
            + self.cp_comm_s
            + self.bubble_s
            + self.pp_comm_s
            + self.dp_comm_s
            + self.optimizer_s
            + self.housekeeping_s
        )

    @property
    def stage_imbalance(self) -> float:
        """Slowest stage over the mean, minus 1."""
        return stage_imbalance(self.stage_microbatch_s)

    @property
    def slowest_stage(self) -> int:
        return self.stage_microbatch_s.index(max(self.stage_microbatch_s))

    @property
    def bubble_share(self) -> float:
        """The bubble as a share of the whole step."""
        return self.bubble_s / self.step_s


def _ring(n: int) -> float:
    """Bytes each of ``n`` ranks moves per byte of a ring all-gather or reduce-scatter."""
    return (n - 1) / n


def stage_times(layout: ParallelLayout, *, layer_s: float, output_s: float) -> list[float]:
    """One microbatch's forward and backward time on every pipeline rank: its layers, and the output on the last."""
    last = layout.pp - 1
    return [layers * layer_s + (output_s if r == last else 0.0) for r, layers in enumerate(layout.layers_per_rank)]


def pipeline_p2p_exposed(
    *,
    pp: int,
    vp: int,
    num_microbatches: int,
    stage_time: float,
    transfer_time: float,
    schedule_time: float | None = None,
    overlap: bool = True,
) -> float:
    """Exposed pipeline point-to-point time of one step, seconds (formulas in the module docstring).

    ``stage_time`` (T) is one microbatch's forward and backward pass on the
    slowest stage, ``transfer_time`` (x) one activation or gradient message over
    the slowest stage boundary, ``schedule_time`` the step's compute and bubble
    without communication (default ``(m + (p − 1)/v)·T``, equal stages), ``overlap`` False the interleaved
    schedule with ``--no-overlap-p2p-communication``.
    """
    p, v, m, T, x = pp, vp, num_microbatches, stage_time, transfer_time
    if schedule_time is None:
        schedule_time = (m + (p - 1) / v) * T
    if p == 1 or x == 0:
        return 0.0
    if v == 1:
        # 1F1B: every send/receive blocks; p − 1 each way to fill and drain, then one exchange after
        # each forward and each backward pass (after only one of them on the two end stages).
        return (2 * (p - 1) + (m if p == 2 else 2 * m)) * x
    if not overlap:
        # Batched and blocking (PP > 2): every chunk's pass waits for its exchange, 2·v·m of them, and the fill
        # and drain add 2·(p − 2) (fitted to the event simulation; never below it).
        return (2 * v * m + 2 * (p - 2)) * x
    # Interleaved, overlap_p2p_comm: the fill and drain's latency or the busiest link's throughput.
    latency = 2 * (p * v - 1) * x
    sends = (2 * v - 1) * m if p == 2 else 2 * v * m
    link_bound = sends * x + (p - 1) * (T + 2 * x) - schedule_time
    return max(latency, link_bound)


def p2p_message_bytes(workload: Workload, layout: ParallelLayout) -> float:
    """One activation (or gradient) message between pipeline stages: ``b·s·h`` elements, /TP when scattered."""
    m = workload.model
    split = layout.tp if layout.sequence_parallel or workload.p2p_scatter_gather else 1
    return layout.micro_batch_size * m.seq_length * m.hidden_size * workload.activation_bytes / split / layout.cp


def p2p_bandwidth(layout: ParallelLayout, gpu: GpuProfile, *, gpus_per_node: int) -> float:
    """The pipeline's link: NVLink while the whole job sits in one node, else the network."""
    inside = layout.tp * layout.cp * layout.dp * layout.pp <= gpus_per_node
    return gpu.intra_node_bandwidth if inside else gpu.inter_node_bandwidth


@dataclass(frozen=True)
class UnitTimes:
    """One microbatch's forward and backward through one transformer layer and through the output layer."""

    layer_compute_s: float
    """A layer's GEMMs at the profile's efficiency and its element-wise kernels at HBM bandwidth."""
    layer_tp_s: float
    """A layer's tensor-parallel collectives."""
    output_compute_s: float
    """The logits GEMM (forward and backward) and the cross entropy over them (``cross_entropy_bytes``) of the last
    stage."""
    output_forward_s: float
    """The forward part of ``output_compute_s``."""
    recompute_flops: float
    """FLOPs recomputation adds per layer and microbatch."""
    layer_cp_s: float = 0.0
    """A layer's context-parallel ring exchange that its attention does not hide."""
    layer_weight_grad_s: float = 0.0
    """The part of a layer's backward that computes its weight gradients (one pass of its linears' GEMMs): what
    a zero-bubble schedule's W pass takes (``zero_bubble``); the rest of the backward is its B pass."""

    @property
    def output_in_layers(self) -> float:
        """The output layer's time in transformer layers: how many fewer layers the last stage should hold."""
        layer = self.layer_compute_s + self.layer_tp_s + self.layer_cp_s
        return self.output_compute_s / layer if layer > 0 else 0.0


def unit_times(workload: Workload, layout: ParallelLayout, gpu: GpuProfile, *, gpus_per_node: int) -> UnitTimes:
    """The per-layer and output-layer times of ``layout``'s TP, CP, micro-batch and SP (see the module docstring).

    Context parallelism: each of the CP ranks computes 1/CP of every sequence
    (Megatron-Core's 2·CP chunks balance the causal attention), so FLOPs,
    element-wise bytes and TP collectives shrink by CP; attention passes every
    rank's keys and values around the ring, CP − 1 transfers of 2·g·d·(s/CP)·b
    in the forward pass and twice that (keys, values and their gradients) in the
    backward, behind the attention's own compute where it is long enough; all but
    1/CP of that compute is blocks without a causal mask
    (``kernels.context_parallel_attention_efficiency``).
    """
    m = workload.model
    t, cp = layout.tp, layout.cp
    s, b, h = m.seq_length / cp, layout.micro_batch_size, m.hidden_size
    n, f = m.num_attention_heads, m.effective_ffn_hidden_size
    vocab = workload.padded_vocab_size(t)

    # FLOPs of one layer's and of the logits' forward for one microbatch on this rank (flops.py).
    layer_fwd = layer_forward_flops(m, sequences=b) / cp
    attention_fwd = attention_core_forward_flops(m, sequences=b) / cp
    if workload.recompute_granularity == "full":
        recompute = layer_fwd
    elif workload.recompute_granularity == "selective":
        recompute = attention_fwd
    else:
        recompute = 0.0
    peak = gpu.peak_flops if workload.mixed_precision else gpu.peak_flops_fp32
    rate = peak * gpu.compute_efficiency
    # FP8: the layers' four GEMMs (QKV, projection, FC1, FC2) at the FP8 peak; the logits and attention core not.
    gemm_peak = fp8_peak(workload, gpu) if workload.fp8_format else peak
    gemm_rate = gemm_peak * (gpu.fp8_compute_efficiency or gpu.compute_efficiency) if workload.fp8_format else rate
    # A tile's fixed time is k½ multiply-adds at the rate its GEMMs run at (``kernels.gemm_depth_half``).
    depth, output_depth = gpu.depth_half(gemm_peak), gpu.depth_half(peak)
    bandwidth = gpu.memory_bandwidth * gpu.memory_efficiency

    # The layer's four GEMMs (QKV, projection, FC1, FC2) on this TP rank, each at its shape's efficiency
    # (``kernels.gemm_pass_efficiency``): ``b·s`` tokens (per CP rank) by (outputs, inputs); forward and the two
    # backward GEMMs, and the forward again with full recomputation.
    tokens = b * s
    g, d = m.effective_num_query_groups, m.effective_kv_channels
    linears = ((n + 2 * g) * d / t, h), (h, n * d / t), (f * (2 if m.swiglu else 1) / t, h), (h, f / t)
    gemm_passes = 3 + (1 if workload.recompute_granularity == "full" else 0)
    layer_gemm_s = _gemm_seconds(linears, gemm_rate, gemm_passes, tokens=tokens, gpu=gpu, depth_half=depth)
    attention_s = _attention_core_seconds(workload, gpu, attention_fwd, seq_length=s, tp=t, cp=cp, peak=peak, rate=rate)
    layer_compute = (
        layer_gemm_s
        + attention_s
        + _element_wise_bytes(workload, layout, seq_length=s) / bandwidth
        + gpu.pass_overhead_s
    )
    # The logits GEMM (forward and the two backward GEMMs) and the loss over its output.
    output_gemm_s = _gemm_seconds(((vocab / t, h),), rate, 3, tokens=tokens, gpu=gpu, depth_half=output_depth)
    loss_forward, loss_backward = cross_entropy_bytes(workload, tokens=tokens, vocab_per_rank=vocab / t)
    return UnitTimes(
        layer_compute_s=layer_compute,
        layer_tp_s=_tp_collectives_seconds(workload, gpu, layout, seq_length=s, layer_gemm_s=layer_gemm_s),
        output_compute_s=output_gemm_s + (loss_forward + loss_backward) / bandwidth,
        output_forward_s=output_gemm_s / 3 + loss_forward / bandwidth,
        recompute_flops=recompute,
        layer_cp_s=_cp_ring_exposed_seconds(
            workload, gpu, layout, seq_length=s, attention_s=attention_s, gpus_per_node=gpus_per_node
        ),
        layer_weight_grad_s=_gemm_seconds(linears, gemm_rate, 1, tokens=tokens, gpu=gpu, depth_half=depth),
    )


def cross_entropy_bytes(workload: Workload, *, tokens: float, vocab_per_rank: float) -> tuple[float, float]:
    """Bytes the vocabulary-parallel cross entropy reads and writes over ``tokens`` rows of ``vocab_per_rank``
    logits on one rank, (forward, backward): passes over the logits at HBM bandwidth, a few per element.

    Megatron-Core's ``tensor_parallel/cross_entropy.py`` (the default) runs one kernel per step over logits of
    ``e`` bytes (the training precision): forward, the cast to fp32 (``e`` read, 4 written), the maximum (4
    read), its subtraction and the exponential (4 read and 4 written each), the sum (4 read) and the division
    into the softmax the backward pass keeps (4 and 4): ``32 + (e + 4)`` bytes an element; backward, the
    product with the loss's gradient in place (4 and 4) and the cast back (4 read, ``e`` written): ``8 +
    (4 + e)``. 38 and 14 in bf16; in fp32 no cast (32 and 8).

    ``--cross-entropy-loss-fusion`` (``fusions/fused_cross_entropy.py``, compiled by ``torch.compile``; counted
    from the code torch 2.13's Inductor generates for it, whose graph passes do not depend on the device):
    forward, the cast with the maximum (``e`` read, 4 written; in fp32 only the read), the subtraction with the
    exponential and the sum, the division (8 each); backward, the update of the kept softmax is not done in
    place (a copy, 4 and 4, then one kernel reads it, writes the softmax back, 4 and 4, and the gradient in
    bf16, 2), and a gradient in another precision is cast back (2 read, ``e`` written): 22 and 18 bytes in
    bf16, 22 and 22 in fp16, 20 and 24 in fp32."""
    e = workload.activation_bytes
    cast = e < 4  # bf16 or fp16 logits go to fp32 for the loss, and their gradient comes back
    if workload.model.cross_entropy_loss_fusion:
        forward = (e + 4 if cast else 4) + 8 + 8
        backward = 8 + 10 + (2 + e if workload.precision != "bf16" else 0)
    else:
        forward = (e + 4 if cast else 0) + 4 + 8 + 8 + 4 + 8
        backward = 8 + (4 + e if cast else 0)
    elements = tokens * vocab_per_rank
    return elements * forward, elements * backward


def _gemm_seconds(
    shapes: tuple[tuple[float, float], ...],
    gemm_rate: float,
    passes: int,
    *,
    tokens: float,
    gpu: GpuProfile,
    depth_half: float,
) -> float:
    """``passes`` passes of GEMMs of ``tokens`` rows by each (outputs, inputs) in ``shapes``, ``2·tokens·out·in``
    FLOPs each, at ``gemm_rate`` times the efficiency of that shape (``kernels.gemm_pass_efficiency``, with a
    tile's fixed time ``depth_half`` multiply-adds deep)."""
    return sum(
        passes
        * 2
        * tokens
        * out
        * inp
        / (gemm_rate * gemm_pass_efficiency(tokens, out, inp, sms=gpu.sms, depth_half=depth_half))
        for out, inp in shapes
    )


def _attention_core_seconds(
    workload: Workload,
    gpu: GpuProfile,
    attention_fwd: float,
    *,
    seq_length: float,
    tp: int,
    cp: int,
    peak: float,
    rate: float,
) -> float:
    """The attention core's forward, backward and (recomputed) forward of one layer and microbatch on this rank.

    Fused (flash) attention runs at the published kernel benchmarks' rate for its shape (``kernels``), in the
    kernel's causal count; unfused (or in fp32), its two batched GEMMs run at the GEMMs' ``rate`` and its
    softmax is an element-wise kernel (``_element_wise_bytes``).
    """
    m = workload.model
    attention_recompute = attention_fwd if workload.recompute_granularity != "none" else 0.0
    if not unfused_attention(workload) and workload.mixed_precision:
        # The kernel's count: causal, half of Megatron's full s² square; forward + backward 3.5 forwards, and the
        # forward again when recomputed. Its share of peak: the causal kernel's at the sequence each CP rank holds,
        # mixed with unmasked blocks' under CP (kernels.context_parallel_attention_efficiency).
        share = gpu.attention_efficiency or context_parallel_attention_efficiency(
            gpu.attention_kernels,
            seq_length=seq_length,
            cp=cp,
            head_dim=m.effective_kv_channels,
            backend=m.attention_backend,
        )
        passes = FORWARD_AND_BACKWARD + (1 if attention_recompute else 0)
        return passes * attention_fwd / 2 / tp / (peak * share)
    return (3 * attention_fwd + attention_recompute) / tp / rate


def _element_wise_bytes(workload: Workload, layout: ParallelLayout, *, seq_length: float) -> float:
    """Bytes the memory-bound kernels of one layer read and write for one microbatch on this rank (module
    docstring): the forward's, twice that backward, what recomputation repeats, and the FP8 casts."""
    m = workload.model
    s, b, h, t = seq_length, layout.micro_batch_size, m.hidden_size, layout.tp
    n, f = m.num_attention_heads, m.effective_ffn_hidden_size
    e = workload.activation_bytes
    sp = layout.sequence_parallel
    masks = 1.0 if m.hidden_dropout > 0 else 0.0
    norms_and_residuals = s * b * h * (2 * 2 * e + 2 * (3 * e + masks)) / (t if sp else 1)
    activation_fn = s * b * f * (3 if m.swiglu else 2) * e / t
    if unfused_attention(workload):
        core_bytes = n * s * s * b * (2 * e + (2 * e + 1 if m.attention_dropout > 0 else 0)) / t
    else:
        core_bytes = 0.0  # fused attention keeps the scores on chip; its FLOPs are counted above
    layer_fwd_bytes = norms_and_residuals + activation_fn + core_bytes
    if workload.recompute_granularity == "full":
        recompute_bytes = layer_fwd_bytes
    elif workload.recompute_granularity == "selective":
        recompute_bytes = core_bytes
    else:
        recompute_bytes = 0.0
    cast_fwd, cast_bwd = fp8_cast_bytes(workload, sequences=b, seq_length=s, tp=t, sequence_parallel=sp)
    if workload.recompute_granularity == "full":
        recompute_bytes += cast_fwd
    return 3 * layer_fwd_bytes + recompute_bytes + cast_fwd + cast_bwd


def _tp_collectives_seconds(
    workload: Workload, gpu: GpuProfile, layout: ParallelLayout, *, seq_length: float, layer_gemm_s: float
) -> float:
    """Tensor parallelism: 4 collectives of ``b·s·h`` per layer (6 with full recompute), each ``2(t−1)/t`` of it
    per GPU over NVLink; with ``--tp-comm-overlap`` what the layer's GEMMs (``layer_gemm_s``) cannot hide."""
    t = layout.tp
    if t == 1:
        return 0.0
    s, b, h, e = seq_length, layout.micro_batch_size, workload.model.hidden_size, workload.activation_bytes
    collectives = 6 if workload.recompute_granularity == "full" else 4
    layer_tp = collectives * (2 * _ring(t) * b * s * h * e / gpu.intra_node_bandwidth + 2 * (t - 1) * link_latency(gpu))
    if workload.tp_comm_overlap:
        # Transformer Engine's userbuffers: each collective runs chunk by chunk around the ring under its
        # GEMM; the first chunk (1/TP) cannot start behind anything, and what the GEMMs cannot cover stays.
        layer_tp = max(layer_tp / t, layer_tp - layer_gemm_s)
    return layer_tp


def _cp_ring_exposed_seconds(
    workload: Workload,
    gpu: GpuProfile,
    layout: ParallelLayout,
    *,
    seq_length: float,
    attention_s: float,
    gpus_per_node: int,
) -> float:
    """Context parallelism: the ring exchange of keys and values (forward) and of them and their gradients
    (backward), ``3·(CP − 1)`` transfers of ``2·g·d/t·(s/CP)·b`` per layer, less the attention compute
    (``attention_s``) it runs behind (unit_times' docstring)."""
    t, cp = layout.tp, layout.cp
    if cp == 1:
        return 0.0
    m = workload.model
    s, b, e = seq_length, layout.micro_batch_size, workload.activation_bytes
    g, d = m.effective_num_query_groups, m.effective_kv_channels
    ring_bytes = 3 * (cp - 1) * 2 * g * d / t * s * b * e
    # Megatron-Core's order tp-cp-dp-pp: the CP ring sits inside a node while TP × CP fits in one.
    link = gpu.intra_node_bandwidth if t * cp <= gpus_per_node else gpu.inter_node_bandwidth
    return max(0.0, ring_bytes / link - attention_s)


def link_latency(gpu: GpuProfile) -> float:
    """One message's or one collective step's latency beyond its bytes: the profile's measured transport latency
    (``GpuProfile.link_latency_s``, from ``--calibrate``), else none (NCCL's microseconds, within the fit)."""
    return gpu.link_latency_s or 0.0


def gradient_buckets(workload: Workload, *, chunk_parameters: float, dp: int) -> int:
    """Buckets of the chunk whose reduction overlaps the backward pass (Megatron-Core's DDP; with interleaving
    only the first chunk is bucketed, as Megatron-LM does): ``--ddp-bucket-size``, else the rank's parameters /
    ``--ddp-num-buckets``, else with ``--overlap-grad-reduce`` Megatron-Core's ``max(40M, 1M × DP)`` parameters,
    else one bucket."""
    if workload.ddp_bucket_size is not None:
        size = float(workload.ddp_bucket_size)
    elif workload.ddp_num_buckets is not None:
        return workload.ddp_num_buckets
    elif workload.overlap_grad_reduce:
        size = float(max(40_000_000, 1_000_000 * dp))
    else:
        return 1
    return max(1, math.ceil(chunk_parameters / size))


def _gathered_bytes(workload: Workload, layout: ParallelLayout, rank_parameters: int) -> float:
    """The distributed optimizer's all-gather of the rank's parameters: in the training precision, but with
    ``--fp8-param-gather`` the layers' linear weights in FP8, 1 byte each (Megatron-Core's DDP gives FP8
    parameters a buffer of their own, gathered as bytes). Their share is the most loaded rank's."""
    gathered = float(workload.activation_bytes * rank_parameters)
    if workload.fp8_param_gather:
        counts = workload.parameter_counts(tp=layout.tp, pp=layout.pp, stage_layers=layout.layers_per_rank)
        gathered -= (workload.activation_bytes - 1) * counts.linear_weight_share * rank_parameters
    return gathered


def data_parallel_time(
    workload: Workload,
    layout: ParallelLayout,
    gpu: GpuProfile,
    *,
    gpus_per_node: int,
    rank_parameters: int,
    backward_s: float,
    forward_s: float,
) -> tuple[float, float]:
    """The data-parallel reduction (and the distributed optimizer's all-gather) of one step: (total, exposed).

    Gradients are reduced over the DP × CP ranks in their buffer's dtype: an all-reduce of ``2·(n−1)/n`` of the
    bytes, or with the distributed optimizer a reduce-scatter of ``(n−1)/n`` and an all-gather of the
    parameters (``_gathered_bytes``: bf16, the FP8 weights in FP8 with ``--fp8-param-gather``). The bandwidth is
    NVLink while the group sits in one node, else the network cards of the group's GPUs in a node. Each bucket's
    collective adds NCCL's ring latency (``ring_latency``), which grows with the group. Overlapped
    (``--overlap-grad-reduce``), the ``k`` buckets are reduced one after another as the last microbatch's
    backward pass (``B``) makes them ready, evenly in time: the reduction ends at
    ``max(B + r, k·r + B/k)`` (``r`` one bucket's time), so ``max(r, R − B·(k−1)/k)`` of it is exposed — the
    last bucket at least, which is why larger data-parallel groups (Megatron-Core's buckets grow with DP) expose
    more. The all-gather with ``--overlap-param-gather`` likewise: its first bucket before the first forward
    pass, the rest behind it.
    """
    dp = layout.dp * layout.cp
    if dp <= 1:
        return 0.0, 0.0
    t = layout.tp
    per_node = max(1, min(dp, gpus_per_node // t))  # DP × CP ranks are TP apart (Megatron-Core's order)
    nodes = math.ceil(dp / per_node)
    if nodes == 1:
        bandwidth = gpu.intra_node_bandwidth
    else:
        bandwidth = min(gpu.intra_node_bandwidth, per_node * gpu.inter_node_bandwidth)
    buckets = gradient_buckets(workload, chunk_parameters=rank_parameters / layout.vp, dp=dp)
    collectives = buckets + layout.vp - 1  # the other chunks reduce as one bucket each
    latency = ring_latency(dp, nodes) if gpu.link_latency_s is None else (dp - 1) * gpu.link_latency_s
    grad_bytes = workload.gradient_bytes * rank_parameters
    if layout.use_distributed_optimizer:
        reduce = _ring(dp) * grad_bytes / bandwidth + collectives * latency
        gather = _ring(dp) * _gathered_bytes(workload, layout, rank_parameters) / bandwidth + collectives * latency
    else:
        reduce = 2 * _ring(dp) * grad_bytes / bandwidth + 2 * collectives * latency
        gather = 0.0

    def exposed(total: float, window: float, overlapped: bool) -> float:
        if not overlapped or total == 0:
            return total
        one = total / collectives
        return max(one, total - window * (buckets - 1) / buckets)

    exposed_s = exposed(reduce, backward_s, workload.overlap_grad_reduce) + exposed(
        gather, forward_s, workload.overlap_param_gather
    )
    return reduce + gather, exposed_s


def estimate_step_time(
    workload: Workload, layout: ParallelLayout, gpu: GpuProfile, *, gpus_per_node: int, rank_parameters: int
) -> StepTimeEstimate:
    """Step time of ``layout`` on ``gpu`` (``rank_parameters``: parameters of the most loaded rank)."""
    m = workload.model
    t, p, v = layout.tp, layout.pp, layout.vp
    b, mbs = layout.micro_batch_size, layout.num_microbatches
    vocab = workload.padded_vocab_size(t)

    units = unit_times(workload, layout, gpu, gpus_per_node=gpus_per_node)
    layer_compute, output_compute, layer_tp, recompute = (
        units.layer_compute_s,
        units.output_compute_s,
        units.layer_tp_s,
        units.recompute_flops,
    )

    # Every stage: its layers (ParallelLayout.stages), the output layer on the last. The slowest sets the pace.
    stages = stage_times(layout, layer_s=layer_compute + layer_tp + units.layer_cp_s, output_s=output_compute)
    slowest = max(range(p), key=lambda r: stages[r])
    layers_slowest = layout.rank_layers(slowest)
    mb_compute = layers_slowest * layer_compute + (output_compute if slowest == p - 1 else 0.0)
    mb_tp = layers_slowest * layer_tp
    mb_cp = layers_slowest * units.layer_cp_s
    mb_time = stages[slowest]

    backward = mb_compute * (2 + (1 if recompute else 0)) / (3 + (1 if recompute else 0))
    # Pipeline: bubble and exposed point-to-point. A zero-bubble schedule fills part of it with W passes.
    scale = 1.0
    if workload.zero_bubble and p > 1:
        # The transformer layers' linears defer their weight gradients; the output layer keeps its own in B
        # (training/split_backward.py: GPTModel builds it outside the layer spec).
        weight = layers_slowest * units.layer_weight_grad_s
        scale = zb_bubble_scale(forward_time=mb_compute - backward, backward_time=backward - weight, weight_time=weight)
    bubble = pipeline_bubble(stages, vp=v) * scale
    if p > 1:
        pp_comm = pipeline_p2p_exposed(
            pp=p,
            vp=v,
            num_microbatches=mbs,
            stage_time=mb_time,
            transfer_time=p2p_message_bytes(workload, layout) / p2p_bandwidth(layout, gpu, gpus_per_node=gpus_per_node)
            + link_latency(gpu),
            schedule_time=mbs * mb_time + bubble,
            overlap=workload.overlap_p2p_comm,
        )
    else:
        pp_comm = 0.0

    dp_total, dp_exposed = data_parallel_time(
        workload,
        layout,
        gpu,
        gpus_per_node=gpus_per_node,
        rank_parameters=rank_parameters,
        backward_s=backward,
        forward_s=mb_compute - backward,
    )

    overhead = step_overhead(workload, layout, gpu, gpus_per_node=gpus_per_node, rank_parameters=rank_parameters)

    model_flops = flops_per_step(m, batch_size=layout.global_batch_size, padded_vocab_size=vocab)
    sequences = layout.global_batch_size // b
    hardware_flops = model_flops + sequences * m.num_layers * recompute
    return StepTimeEstimate(
        microbatch_compute_s=mb_compute,
        microbatch_tp_comm_s=mb_tp,
        compute_s=mbs * mb_compute,
        tp_comm_s=mbs * mb_tp,
        bubble_s=bubble,
        pp_comm_s=pp_comm,
        dp_comm_s=dp_exposed,
        dp_comm_total_s=dp_total,
        optimizer_s=overhead.optimizer_s,
        housekeeping_s=overhead.housekeeping_s,
        cp_comm_s=mbs * mb_cp,
        bubble_scale=scale,
        stage_microbatch_s=tuple(stages),
        model_flops=model_flops,
        hardware_flops=hardware_flops,
    )
