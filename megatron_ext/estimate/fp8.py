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

    Transformer Engine casts each FP8 GEMM's input to FP8 in the forward pass and its output gradient in the
    backward, each read in the training precision (``e`` bytes) and written in FP8 twice, as it is and transposed
    (Hopper's FP8 GEMMs take one layout; the weight-gradient GEMM needs the other): ``e + 2`` bytes an element.
    The projection's input (``n·d/t`` wide) and FC2's (``f/t``) are cast; in the backward pass the output
    gradients of QKV (``(n + 2g)·d/t``), FC1 (``f/t``, ``2f/t`` with SwiGLU), the projection and FC2 (``h``
    each: the whole gradient, before the row-parallel GEMM). (0, 0) without FP8.

    What ``--fp8-recipe`` changes (Transformer Engine 2's ``normalization.cpp``, ``activation.cpp`` and
    ``quantizer.cpp``, which choose each kernel by the quantizer):

    * ``delayed``: the scale is known before the tensor is, so the norm before QKV and FC1 writes their FP8 input
      itself (``LayerNormLinear``, ``LayerNormMLP``): those two casts cost nothing.
    * ``tensorwise`` (current scaling): the scale needs the tensor's amax first. The norm and the activation
      compute it as they write their output in the training precision, and a cast kernel follows: QKV's and FC1's
      inputs (``h``, ``h/t`` with SP, cast before the all-gather) cost ``e + 2`` bytes an element. Every other
      cast's tensor comes from a kernel that does not compute it (the attention, the incoming gradients): an amax
      pass of its own reads it once more, ``e`` bytes, except FC1's output gradient, whose amax the activation's
      backward computes.
    * ``blockwise`` (1×128 and 128×128 blocks): each block's scale is computed in the cast kernel, but the norm
      cannot write the blocks, so QKV's and FC1's inputs are cast on their own, as with ``tensorwise``, with no
      amax pass.
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
    cast = e + 2
    forward = tokens * (n * d + f) / tp * cast
    backward = tokens * (((n + 2 * g) * d + (2 if m.swiglu else 1) * f) / tp + 2 * h) * cast
    if workload.fp8_recipe in ("tensorwise", "blockwise"):
        forward += tokens * 2 * h / (tp if sequence_parallel else 1) * cast
    if workload.fp8_recipe == "tensorwise":
        forward += tokens * n * d / tp * e
        backward += tokens * ((n + 2 * g) * d / tp + 2 * h) * e
    return forward, backward
