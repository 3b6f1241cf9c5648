"""Memory on the most loaded GPU: weights, gradients, optimizer states, activations.

Everything here is arithmetic on the model shape and the layout, so that the
layout calculator can evaluate thousands of layouts per second.

**Parameters per rank.** Exact counts of Megatron-Core's ``GPTModel`` for
every pipeline stage, with the layers ``ParallelLayout.stages`` places there
(``shapes.parameter_counts``, the formula's one home).

**Bytes per parameter** (Megatron-LM's accounting,
``megatron/training/theoretical_memory_usage.py``): mixed precision keeps bf16
weights (2), fp32 gradients (4, ``grad_reduce_in_fp32``) and fp32 master
weights plus two Adam moments (12): 18 bytes; the distributed optimizer
shards the 12 over DP: ``6 + 12/DP``. In fp32: ``4 + 4 + 8`` or ``8 + 8/DP``.

**Activations per layer and microbatch** (Korthikanti et al. 2022, "Reducing
Activation Recomputation in Large Transformer Models", Table 2, with ``s``
sequence, ``b`` micro-batch, ``h`` hidden, ``a`` heads, ``t`` TP, 2-byte
activations and 1-byte dropout masks)::

    no parallelism               s·b·h·(34 + 5·a·s/h)
    tensor parallel              s·b·h·(10 + 24/t + 5·a·s/(h·t))
    tensor + sequence parallel   s·b·h·(34 + 5·a·s/h) / t
    + selective recomputation    drops the 5·a·s/h attention-core term
    full recomputation           2·s·b·h per checkpointed layer input (/t with SP)

The 34 is 10 bytes·sbh that TP alone replicates (two norm inputs 4, the
inputs of the QKV and first MLP GEMMs 2 + 2, two dropout masks 1 + 1) and 24
that it splits (Q, K 4; V 2; projection input 2; first MLP output 8; GeLU
output 8). We keep each term's origin, so the same formula covers grouped-query
attention (K, V of width ``g·d``), any MLP width ``f`` and SwiGLU (first MLP
output ``2f``), dropout off (no masks), and fused attention (Transformer
Engine / flash: no ``a·s²`` terms, only fp32 softmax statistics ``4·a·s·b``).

**In flight.** Each rank holds the activations of its warm-up forward passes
plus one (``pipeline.in_flight_passes``): ``min(m, p − r)`` microbatches under
1F1B, ``(v + 1)·p − 1`` chunks of ``l/(p·v)`` layers on the first stage of an
interleaved pipeline, ``p·(1 + (p − 1)/(p·v))`` microbatches' worth of its
layers (Narayanan et al. 2021, §2.2.2; the factor Megatron-LM applies). Chunks of
different sizes (uneven splits) are held for their own spans along that order
(``pipeline.peak_held``).

**Embedding and output.** As Megatron-LM counts them: the token ids (8 bytes)
and the embedding dropout mask per in-flight microbatch on the first stage;
the final norm's output and the fp32 logits ``4·s·b·h·(1 + V/h)`` for one
microbatch on the stage with the output layer. With SP they are divided by t.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from megatron_ext.estimate.workload import Workload
from megatron_ext.parallel.layout import ParallelLayout
from megatron_ext.parallel.pipeline import in_flight_passes, peak_held


def unfused_attention(workload: Workload) -> bool:
    """Whether attention materialises the ``a·s²`` scores (``--attention-backend unfused`` or ``local``).

    Every other backend (Transformer Engine's flash/fused, PyTorch's flash or
    memory-efficient SDPA, ``auto``) keeps them on chip.
    """
    return workload.model.attention_backend in ("unfused", "local")


@dataclass(frozen=True, kw_only=True)
class LayerActivations:
    """Activation bytes of one transformer layer for one microbatch on one GPU."""

    stored: float
    """Kept from the layer's forward until its backward, under the recompute policy (per layer)."""
    full: float
    """Without any recomputation: what a recomputed layer needs again during its backward."""


def layer_activations(
    workload: Workload, *, micro_batch_size: int, tp: int, sequence_parallel: bool, cp: int = 1
) -> LayerActivations:
    """Korthikanti et al. 2022, Table 2, term by term (see the module docstring); with context parallelism
    every rank keeps the activations of its 1/CP of each sequence."""
    m = workload.model
    s, b, h = m.seq_length / cp, micro_batch_size, m.hidden_size
    n, g, d, f = (
        m.num_attention_heads,
        m.effective_num_query_groups,
        m.effective_kv_channels,
        m.effective_ffn_hidden_size,
    )
    e = workload.activation_bytes
    masks = 1.0 if m.hidden_dropout > 0 else 0.0
    # Replicated by TP alone: two norm inputs, the QKV and fc1 GEMM inputs, two dropout masks.
    replicated = s * b * h * (2 * e + e + e + 2 * masks)
    # Split by TP: Q, K, V, the projection input, fc1's output (2f with SwiGLU), the activation's output.
    split = s * b * e * (n * d + 2 * g * d + n * d + f * (2 if m.swiglu else 1) + f)
    core: float
    if unfused_attention(workload):
        # Unfused attention keeps the softmax output, the dropout mask and the dropout output.
        core = n * s * s * b * (e + (1 + e if m.attention_dropout > 0 else 0))
    else:
        # Fused (Transformer Engine / flash) attention keeps only fp32 softmax statistics.
        core = 4.0 * n * s * b
    full = (replicated / tp if sequence_parallel else replicated) + (split + core) / tp
    granularity = workload.recompute_granularity
    if granularity == "selective":
        stored = full - core / tp
    elif granularity == "full":
        stored = s * b * h * e / (tp if sequence_parallel else 1)  # the checkpointed layer input
    else:
        stored = full
    return LayerActivations(stored=stored, full=full)


@dataclass(frozen=True, kw_only=True)
class StageMemory:
    """Memory of one GPU of a pipeline stage, bytes."""

    stage: str
    """``first``, ``last``, ``rank R`` (a middle stage) or ``only`` (PP = 1)."""
    parameters: int
    """Parameters held by the GPU."""
    weights_bytes: float
    """Model weights (bf16/fp16, or fp32)."""
    gradients_bytes: float
    """Gradient buffer (fp32)."""
    optimizer_bytes: float
    """fp32 master weights and Adam moments (sharded over DP with the distributed optimizer)."""
    activations_bytes: float
    """Activations of all in-flight microbatches, embedding and output terms, recompute working memory."""
    in_flight_microbatches: float
    """Microbatches' worth of this stage's layers held at the peak (chunks / VP)."""

    @property
    def weights_and_optimizer_bytes(self) -> float:
        return self.weights_bytes + self.gradients_bytes + self.optimizer_bytes

    @property
    def total_bytes(self) -> float:
        return self.weights_and_optimizer_bytes + self.activations_bytes


@dataclass(frozen=True, kw_only=True)
class MemoryEstimate:
    """Memory of the most loaded GPU, with the first and last stage for reference."""

    most_loaded: StageMemory
    """The stage with the largest total (the one that has to fit)."""
    first: StageMemory
    """A GPU of the first pipeline stage."""
    last: StageMemory
    """A GPU of the last pipeline stage (the same object as ``first`` when PP = 1)."""
    stages: tuple[StageMemory, ...]
    """A GPU of every pipeline stage, in order (uneven stages: a middle one can be the most loaded)."""
    layer_activation_bytes: float
    """Stored activations of one layer for one microbatch."""
    bytes_per_parameter: float
    """Weights + gradients + optimizer states per parameter (18, or 6 + 12/DP, …)."""

    @property
    def total_bytes(self) -> float:
        return self.most_loaded.total_bytes


def bytes_per_parameter(workload: Workload, layout: ParallelLayout) -> tuple[float, float, float]:
    """(weights, gradients, optimizer states) bytes per parameter: Megatron-LM's 2 + 4 + 12 or 2 + 4 + 12/DP;
    the gradients 2 with --grad-reduce-in-bf16 (the optimizer's fp32 copy of its shard is transient)."""
    if workload.mixed_precision:
        weights, grads, optim = 2.0, workload.gradient_bytes, 12.0
    else:
        weights, grads, optim = 4.0, 4.0, 8.0
    if layout.use_distributed_optimizer:
        # Megatron-Core shards over the data-parallel ranks and, with context parallelism, over CP too.
        optim /= layout.dp * layout.cp
    return weights, grads, optim


def checkpoint_bytes_per_parameter(*, mixed_precision: bool, distributed_optimizer: bool) -> float:
    """Bytes a checkpoint holds per parameter, whatever the layout (the distributed optimizer's shards add up
    to one copy): the weights in their dtype (2 in bf16/fp16, 4 in fp32) and Adam's two fp32 moments (8), plus
    the fp32 main weights (4) that mixed precision and the distributed optimizer save apart from the weights
    (Megatron-Core's optimizer ``sharded_state_dict``). Megatron-LM's 18 bytes less the gradients (4)."""
    weights = 2.0 if mixed_precision else 4.0
    main_copy = 4.0 if mixed_precision or distributed_optimizer else 0.0
    return weights + 8.0 + main_copy


def estimate_memory(
    workload: Workload, layout: ParallelLayout, *, in_flight: Sequence[int] | None = None
) -> MemoryEstimate:
    """Memory of every kind on every pipeline stage; the largest total is what must fit.

    ``in_flight``: model chunks whose activations every rank holds at its
    peak, for another schedule than Megatron-Core's (default: its warm-up
    plus one, ``pipeline.in_flight_passes``).
    """
    m = workload.model
    tp, pp, vp = layout.tp, layout.pp, layout.vp
    s, b, h = m.seq_length / layout.cp, layout.micro_batch_size, m.hidden_size
    sp = layout.sequence_parallel
    params = workload.parameter_counts(tp=tp, pp=pp, stage_layers=layout.layers_per_rank)
    per_weight, per_grad, per_optim = bytes_per_parameter(workload, layout)
    layer = layer_activations(workload, micro_batch_size=b, tp=tp, sequence_parallel=sp, cp=layout.cp)

    def chunk_activations(layers_per_chunk: int) -> tuple[float, float]:
        """(stored bytes of one chunk's layers for one microbatch, recompute working memory)."""
        if layers_per_chunk == 0:
            return 0.0, 0.0
        if workload.recompute_granularity == "full":
            k = min(workload.recompute_num_layers, layers_per_chunk)
            if workload.recompute_method == "uniform":
                return math.ceil(layers_per_chunk / k) * layer.stored, k * layer.full
            # block: the first k layers of the chunk are recomputed, the others keep everything
            return k * layer.stored + (layers_per_chunk - k) * layer.full, layer.full
        return layers_per_chunk * layer.stored, 0.0

    masks = 1.0 if m.hidden_dropout > 0 else 0.0
    embedding = s * b * (8 + h * masks) / (tp if sp else 1)
    vocab = workload.padded_vocab_size(tp)
    output = 4 * s * b * h / (tp if sp else 1) + 4 * s * b * vocab / tp

    def stage(name: str, rank: int) -> StageMemory:
        chunks = (
            in_flight[rank]
            if in_flight is not None
            else in_flight_passes(
                pp=pp,
                vp=vp,
                num_microbatches=layout.num_microbatches,
                pipeline_rank=rank,
                group_size=layout.microbatch_group_size_per_vp_stage,
            )
        )
        microbatches = chunks / vp
        per_chunk = [chunk_activations(c.num_layers) for c in layout.stages[rank]]
        working = max(w for _, w in per_chunk)
        if in_flight is None and not workload.zero_bubble:
            # Each chunk held for its own span in Megatron-Core's order (uneven chunks differ).
            held = peak_held(
                [stored for stored, _ in per_chunk],
                pp=pp,
                num_microbatches=layout.num_microbatches,
                pipeline_rank=rank,
                group_size=layout.microbatch_group_size_per_vp_stage,
            )
        else:
            # Another schedule's count (zero bubble's order holds its passes longer): at the largest chunk, a bound.
            held = chunks * max(stored for stored, _ in per_chunk)
        activations = held + working
        if rank == 0:
            activations += microbatches * embedding
        if rank == pp - 1:
            activations += output
        parameters = params.stage_ranks[rank]
        return StageMemory(
            stage=name,
            parameters=parameters,
            weights_bytes=parameters * per_weight,
            gradients_bytes=parameters * per_grad,
            optimizer_bytes=parameters * per_optim,
            activations_bytes=activations,
            in_flight_microbatches=microbatches,
        )

    if pp == 1:
        stages: tuple[StageMemory, ...] = (stage("only", 0),)
    else:
        stages = tuple(stage("first" if r == 0 else "last" if r == pp - 1 else f"rank {r}", r) for r in range(pp))
    most = max(stages, key=lambda st: st.total_bytes)
    return MemoryEstimate(
        most_loaded=most,
        first=stages[0],
        last=stages[-1],
        stages=stages,
        layer_activation_bytes=layer.stored,
        bytes_per_parameter=per_weight + per_grad + per_optim,
    )
