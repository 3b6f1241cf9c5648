"""FP8 (``--fp8-format`` with ``--fp8-recipe``, Transformer Engine): the peak its GEMMs run at, and the bytes its casts
move, which the step-time model adds to the layer's element-wise kernels (``step_time``)."""

from __future__ import annotations

from megatron_ext.estimate.hardware import GpuProfile
from megatron_ext.estimate.workload import Workload


def fp8_peak(workload: Workload, gpu: GpuProfile) -> float:
    """The FP8 peak ``--fp8-format``'s GEMMs run at; a ValueError naming the GPU when it has no FP8, or not the
    scaling ``--fp8-recipe`` asks for (MXFP8's block scales are Blackwell's tensor cores)."""
    if gpu.peak_flops_fp8 is None:
        raise ValueError(
            f"--fp8-format {workload.fp8_format}: the {gpu.name} profile has no FP8 tensor cores (FP8 needs Hopper "
            "or newer: --gpu h100-sxm, h200)"
        )
    if workload.fp8_recipe == "mxfp8":
        raise ValueError(
            f"--fp8-recipe mxfp8: the {gpu.name} profile's tensor cores have no MXFP8 (Blackwell's; Transformer "
            "Engine refuses it on Hopper): give --fp8-recipe tensorwise, blockwise or delayed"
        )
    return gpu.peak_flops_fp8


def fp8_cast_bytes(
    workload: Workload, *, sequences: int, seq_length: float, tp: int, sequence_parallel: bool = False
) -> tuple[float, float]:
    """Bytes that ``--fp8-format``'s casts read and write in one layer's forward and backward pass on one rank.

    Transformer Engine casts each FP8 GEMM's input in the forward pass and its output gradient in the backward,
    each needed twice, as it is and transposed (Hopper's FP8 GEMMs take one layout; the weight-gradient GEMM needs
    the other). Counted from Transformer Engine 2's kernel choice by quantizer (``normalization.cpp``,
    ``quantizer.cpp``, ``distributed.py``'s FP8 all-gather) for the layers of Megatron-Core's Transformer Engine
    spec (QKV and FC1 behind TE's fused norm, the projection and FC2 ``TERowParallelLinear``, the activation
    Megatron-Core's own, in the training precision), ``e`` bytes an element in that precision:

    * **A local tensor** (the projection's input, ``n·d/t`` wide; FC2's, ``f/t``; the output gradients of QKV,
      ``(n + 2g)·d/t``, and of FC1, ``f/t``, ``2f/t`` with SwiGLU): one kernel reads it and writes both layouts,
      ``e + 2``; current scaling (``tensorwise``) first reads it once more for its amax, ``+ e``.
    * **A tensor sequence parallelism gathers** (the inputs of QKV and FC1 behind the norm, ``h`` wide; the output
      gradients of the projection and FC2): ``delayed`` and ``tensorwise`` cast the rank's ``1/t`` of it in one
      layout (``e + 1`` on ``h/t``; ``tensorwise`` reading it again for its amax, except behind the norm, which
      computes it), gather it and transpose the whole (``2`` on ``h``); ``blockwise`` casts both layouts of its
      share (``e + 2`` on ``h/t``) and gathers both. Without SP the rank holds the whole ``h``: ``e + 2``
      (``tensorwise`` ``+ e`` for the gradients' amax).
    * **Behind the norm with delayed scaling** the norm writes FP8 itself (its own write, counted with the norm), and
      only the transpose is added: ``2`` on ``h``. ``tensorwise`` and ``blockwise`` norms write the training
      precision (the first with the amax), and a cast follows.

    ``(0, 0)`` without FP8.
    """
    if not workload.fp8_format:
        return 0.0, 0.0
    m = workload.model
    n, g, d, f, h = (
        m.num_attention_heads,
        m.effective_num_query_groups,
        m.effective_kv_channels,
        m.effective_ffn_hidden_size,
        m.hidden_size,
    )
    tokens = sequences * seq_length
    e = workload.activation_bytes
    recipe = workload.fp8_recipe
    amax = e if recipe == "tensorwise" else 0.0
    local = e + 2 + amax  # a byte an element for each layout, after reading it (and its amax pass)

    def gathered(*, after_norm: bool) -> float:
        """Bytes of one ``h``-wide tensor sequence parallelism gathers (or, without SP, the rank holds whole)."""
        own_amax = 0.0 if after_norm else amax
        if recipe == "delayed" and after_norm:
            return 2 * h  # the transpose of the norm's FP8 output (gathered first with SP)
        if not sequence_parallel:
            return (e + 2 + own_amax) * h
        if recipe == "blockwise":
            return (e + 2) * h / tp
        return (e + 1 + own_amax) * h / tp + 2 * h

    forward = tokens * ((n * d + f) / tp * local + 2 * gathered(after_norm=True))
    backward = tokens * (((n + 2 * g) * d + (2 if m.swiglu else 1) * f) / tp * local + 2 * gathered(after_norm=False))
    return forward, backward
