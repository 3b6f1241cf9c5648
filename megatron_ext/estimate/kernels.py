"""Kernel efficiency from shapes: the fused attention kernel's share of the GPU's peak, from published benchmarks.

A flash attention kernel's throughput depends on the sequence length it sees, the head dimension, causal
masking and the GPU generation: short sequences leave the tensor cores waiting on the softmax and on the tile
loads, and causal masking skips half the tiles but balances the work worse. One constant cannot describe it
(``docs/layout-model.md``: the 8B model at sequence 8192 and GPT-3 at 2048 need shares of peak 50% apart).

The curves are the FlashAttention-2 paper's forward + backward benchmarks (Dao 2023, "FlashAttention-2: Faster
Attention with Better Parallelism and Work Partitioning", arXiv 2307.08691, Fig. 4 on A100 80GB SXM4 and Fig. 7
on H100 80GB SXM5; the same plots as ``assets/flash2_{a100,h100}_fwd_bwd_benchmark.png`` of
``Dao-AILab/flash-attention`` at 4f285b35): batch × sequence = 16k tokens, hidden 2048 (head dimension 64 or
128), bf16/fp16, causal (a GPT's attention), TFLOP/s in the paper's count. That count is the kernel's own: the forward pass is
``4·s²·d·n`` per sequence, halved when causal, and the backward pass ``2.5×`` the forward (its recomputation
included), so forward + backward is ``3.5×``.

These are kernel measurements, not end-to-end runs: nothing here is fitted to a training run. The H200 has
the H100's SMs and uses its curves. Between the tabulated points the share is interpolated in ``log2(s)``;
below 512 and above 16k tokens it is the end point's; between head dimensions 64 and 128 it is interpolated,
and a larger head dimension takes 128's curve (the paper tabulates forward + backward for 64 and 128 only).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType

SEQUENCE_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
"""The benchmarks' sequence lengths."""

FLASH_ATTENTION_2_TFLOPS: Mapping[tuple[str, int], tuple[float, ...]] = MappingProxyType(
    {
        # (GPU generation, head dimension): causal forward + backward TFLOP/s at SEQUENCE_LENGTHS.
        ("ampere", 64): (88, 119, 140, 156, 165, 171),
        ("ampere", 128): (99, 133, 155, 173, 182, 189),
        ("hopper", 64): (141, 192, 232, 257, 273, 284),
        ("hopper", 128): (163, 221, 265, 294, 308, 328),
    }
)
"""FlashAttention-2 paper, Figs. 4(c, d) (A100) and 7(c, d) (H100): causal (a GPT's attention) forward + backward
TFLOP/s of FlashAttention-2, in the kernel's count."""

CUDNN_H100_TFLOPS: Mapping[tuple[str, bool, int], tuple[float, ...]] = MappingProxyType(
    {
        # (pass, causal, head dimension): cuDNN 9.1's TFLOP/s at SEQUENCE_LENGTHS on H100 SXM5, bf16/fp16.
        ("forward", True, 64): (225, 288, 334, 363, 379, 388),
        ("forward", True, 128): (315, 410, 484, 518, 529, 539),
        ("forward", False, 64): (335, 373, 395, 408, 412, 413),
        ("forward", False, 128): (497, 574, 617, 609, 600, 595),
        ("backward", False, 64): (266, 348, 395, 417, 432, 433),
        ("backward", False, 128): (305, 408, 465, 499, 518, 516),
    }
)
"""The FlashAttention-3 paper's cuDNN bars (Shah et al. 2024, arXiv 2407.08608v2, Fig. 5 forward, Fig. 6 backward;
H100 SXM5 at 1830 MHz): the kernel Transformer Engine's fused attention runs on Hopper. The paper's backward is
non-causal only: the causal backward is taken as the non-causal one times the forward's causal / non-causal
ratio at the same length (masking costs both passes alike)."""


def _forward_and_backward(forward: Sequence[float], backward: Sequence[float]) -> tuple[float, ...]:
    """A forward and a backward rate (TFLOP/s, length by length) as one: ``3.5 / (1/forward + 2.5/backward)``."""
    return tuple(FORWARD_AND_BACKWARD / (1 / f + 2.5 / b) for f, b in zip(forward, backward, strict=True))


@functools.cache
def cudnn_causal_forward_and_backward(head_dim: int) -> tuple[float, ...]:
    """cuDNN's causal forward + backward TFLOP/s on H100 at ``SEQUENCE_LENGTHS`` (head dimension 64 or 128), the
    backward as ``CUDNN_H100_TFLOPS`` says."""
    forward = CUDNN_H100_TFLOPS[("forward", True, head_dim)]
    ratio = [c / n for c, n in zip(forward, CUDNN_H100_TFLOPS[("forward", False, head_dim)], strict=True)]
    backward = [b * r for b, r in zip(CUDNN_H100_TFLOPS[("backward", False, head_dim)], ratio, strict=True)]
    return _forward_and_backward(forward, backward)


@functools.cache
def cudnn_full_forward_and_backward(head_dim: int) -> tuple[float, ...]:
    """cuDNN's forward + backward TFLOP/s without a mask (every query against every key) on H100 at
    ``SEQUENCE_LENGTHS``: the paper's non-causal bars."""
    return _forward_and_backward(
        CUDNN_H100_TFLOPS[("forward", False, head_dim)], CUDNN_H100_TFLOPS[("backward", False, head_dim)]
    )


BENCHMARK_PEAK_TFLOPS: Mapping[str, float] = MappingProxyType({"ampere": 312.0, "hopper": 989.0})
"""The dense bf16/fp16 peak of the benchmarked GPUs (A100 SXM4, H100 SXM5), against which a share is taken."""

FORWARD_AND_BACKWARD = 3.5
"""The kernel count's forward + backward: the forward pass and a backward pass of 2.5 forwards."""


def _at_length(values: tuple[float, ...], seq_length: float) -> float:
    """``values`` (at ``SEQUENCE_LENGTHS``) at ``seq_length``, interpolated in log2 and clamped at the ends."""
    x = math.log2(max(SEQUENCE_LENGTHS[0], min(SEQUENCE_LENGTHS[-1], seq_length)))
    points = [math.log2(s) for s in SEQUENCE_LENGTHS]
    for i in range(len(points) - 1):
        if x <= points[i + 1]:
            w = (x - points[i]) / (points[i + 1] - points[i])
            return values[i] + w * (values[i + 1] - values[i])
    return values[-1]


def attention_backend_kernel(backend: str, generation: str) -> str:
    """Which benchmarked kernel a fused ``--attention-backend`` runs on a GPU generation: ``flash`` is
    FlashAttention-2 (Transformer Engine's flash backend, PyTorch's flash SDPA); ``fused`` is cuDNN on Hopper
    (Transformer Engine's fused attention) and FlashAttention-2's curve on Ampere, where no cuDNN benchmark is
    published; ``auto`` is what Transformer Engine picks by default: cuDNN on Hopper, FlashAttention-2 on
    Ampere."""
    if backend == "flash" or generation != "hopper":
        return "flash-attention-2"
    return "cudnn"


def attention_kernel_efficiency(
    generation: str, *, seq_length: float, head_dim: int, backend: str = "auto", causal: bool = True
) -> float:
    """The fused attention kernel's forward + backward share of the dense bf16 peak, in the kernel's count
    (``FORWARD_AND_BACKWARD`` × the multiply-adds of the scores it computes: ``4·s²·d·n / 2`` causal), for queries
    and keys ``seq_length`` long, on ``backend`` (``attention_backend_kernel``). ``causal=False``: a block without
    a mask, cuDNN's non-causal bars; FlashAttention-2's non-causal bars are not taken, its causal curve stands for
    both (at the same length a bound: the masked kernel is the slower).

    ``generation``: ``ampere`` (A100) or ``hopper`` (H100, H200); KeyError for another."""
    if attention_backend_kernel(backend, generation) == "cudnn":
        curve = cudnn_causal_forward_and_backward if causal else cudnn_full_forward_and_backward
        low, high = curve(64), curve(128)
    else:
        low, high = FLASH_ATTENTION_2_TFLOPS[(generation, 64)], FLASH_ATTENTION_2_TFLOPS[(generation, 128)]
    at_64, at_128 = _at_length(low, seq_length), _at_length(high, seq_length)
    w = (min(max(head_dim, 64), 128) - 64) / 64
    return (at_64 + w * (at_128 - at_64)) / BENCHMARK_PEAK_TFLOPS[generation]


def context_parallel_attention_efficiency(
    generation: str, *, seq_length: float, cp: int, head_dim: int, backend: str = "auto"
) -> float:
    """The attention kernels' share of peak on one of ``cp`` context-parallel ranks, each holding ``seq_length``
    (the sequence over CP) queries. Transformer Engine's ring (``AttnFuncWithCPAndKVP2P``, load-balanced: a rank
    holds chunks ``i`` and ``2·CP−1−i``) runs CP steps: the first on the rank's own keys, causal over
    ``seq_length``; each other a block without a mask, all the rank's queries against half of a peer's keys or
    half its queries against all of them (its sections "lower-triangle" and "upper-triangle"), as much work as the
    causal step. So ``1/CP`` of the work runs at the causal rate and the rest at the unmasked rate of blocks
    ``seq_length / 2`` deep; CP 1 is the causal kernel alone. On FlashAttention-2's curve, which has no unmasked
    rate, the whole runs at the causal rate over ``seq_length`` (its causal rate at half the depth would price
    the unmasked blocks slower than the masked kernel)."""
    causal = attention_kernel_efficiency(generation, seq_length=seq_length, head_dim=head_dim, backend=backend)
    if cp == 1 or attention_backend_kernel(backend, generation) != "cudnn":
        return causal
    full = attention_kernel_efficiency(
        generation, seq_length=seq_length / 2, head_dim=head_dim, backend=backend, causal=False
    )
    return 1 / (1 / (cp * causal) + (cp - 1) / (cp * full))


GEMM_TILE = 128
"""The output tile of one thread block of a large bf16 GEMM (cuBLAS/CUTLASS on A100 and H100: 128 × 128 and
wider): a GEMM is cut into such tiles, one per streaming multiprocessor at a time."""

GEMM_TILE_FIXED_S = 1.1e-6
"""A GEMM tile's fixed time, seconds: filling its pipeline (the first loads of its operands from memory) and its
epilogue (the accumulators out to memory), during which its multiprocessor's tensor cores idle. Fitted (minimax
over each GEMM's rate relative to the deepest ``k``) on one table, tilelang's FP16 GEMMs of M = N = 8192 by
K = 256…16384 on H800 SXM (``tests/estimate/test_gemm_shapes.py``, ``TILELANG_FP16_H800``: ``k½`` = 252 there);
validated on cuBLAS on H100 (XLA's measured table) and on two FP8 tables (tilelang, DeepGEMM), none fitted."""


def gemm_depth_half(peak_flops: float, sms: int) -> float:
    """The depth ``k½`` at which a GEMM tile's fixed time equals its multiply-adds: ``τ · (P / sms) / (2·T²)``.

    A ``T × T`` tile does ``2·T²`` FLOPs per unit of ``k`` at its multiprocessor's share of the peak, ``P / sms``
    (``P``: the peak these GEMMs run at, bf16 or FP8), and spends ``τ`` (``GEMM_TILE_FIXED_S``) on its pipeline's
    fill and its epilogue, whatever ``k``: its rate is ``k / (k + k½)`` of the best.

    The evidence (``tests/estimate/test_gemm_shapes.py``): the published GEMM tables by K follow ``k/(k + k½)``
    within a few percent from K = 256 to 16384; tilelang's FP8 table measured before and after a change to its
    benchmark's epilogue alone (the output tile's shared-memory layout, tile-ai/tilelang b2acfc37) moves ``k½``
    from about 800 to 440, so the fixed cost is a tile's and lies in its epilogue, not in the main loop; and
    FP8's doubled rate, with a one-byte output where FP16's is two, raises ``k½`` 1.7-fold (436 against 252):
    a fixed time, not the output's bytes. No published A100 table by K was found: A100's ``k½`` (97) is this
    formula's with the H100's ``τ``, not a measurement.
    """
    return GEMM_TILE_FIXED_S * peak_flops / sms / (2 * GEMM_TILE * GEMM_TILE)


def gemm_shape_efficiency(m: float, n: float, k: float, *, sms: int, depth_half: float) -> float:
    """The share of a GEMM's best rate that an ``m × k`` by ``k × n`` product reaches, from its shape alone.

    Two losses, both of small or odd shapes (Narayanan et al. 2021, §5.1: larger GEMMs run closer to peak):

    * **wave quantization**: the ``⌈m/T⌉·⌈n/T⌉`` output tiles run in waves of ``sms`` (one tile per
      multiprocessor): a last partial wave leaves the others idle, ``tiles / (waves · sms)``;
    * **depth**: a tile's fixed time (its pipeline's fill and its epilogue, ``gemm_depth_half``) is amortised
      over the ``k`` dimension: ``k / (k + depth_half)``, half the best rate at ``k = depth_half``.
    """
    tiles = math.ceil(m / GEMM_TILE) * math.ceil(n / GEMM_TILE)
    waves = math.ceil(tiles / sms)
    return tiles / (waves * sms) * k / (k + depth_half)


def gemm_pass_efficiency(m: float, n: float, k: float, *, sms: int, depth_half: float) -> float:
    """The mean shape efficiency of one linear layer's forward GEMM (``m`` tokens × ``k`` in → ``n`` out) and its
    two backward GEMMs (the input gradient, ``m × n`` by ``n × k``; the weight gradient, ``k × m`` by ``m × n``),
    weighted by their equal FLOPs: three passes in the time of their harmonic mean."""
    shapes = ((m, n, k), (m, k, n), (k, n, m))
    return 3 / sum(1 / gemm_shape_efficiency(*shape, sms=sms, depth_half=depth_half) for shape in shapes)
