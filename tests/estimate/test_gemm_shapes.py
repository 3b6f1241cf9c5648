"""The GEMM shape model (``estimate.kernels.gemm_shape_efficiency``) against published GEMM rates by shape.

Each table below is a published measurement of one GEMM kernel's rate at several shapes on one GPU. What is
checked is relative: the rate at each shape over the rate at the table's deepest shape (largest K), measured
against modelled, so that neither the kernel's best share of peak nor its clock enters. The K sweeps keep M and
N (and so the tiles and their waves) fixed: they test the depth term ``k / (k + k½)`` alone.

Which source does what:

* fit: ``TILELANG_FP16_H800`` alone sets the tile's fixed time (``kernels.GEMM_TILE_FIXED_S``);
* validation, bf16 (never fitted): ``XLA_SM90_BF16``, cuBLAS on Hopper, three batch counts;
* validation, FP8 (never fitted; FP8's ``k½`` is the bf16 one times the FP8 / bf16 peak ratio):
  ``TILELANG_FP8_H800`` and ``DEEPGEMM_H800``;
* evidence for where the fixed cost lies: ``TILELANG_FP8_H800_BEFORE``, the same FP8 benchmark before its
  epilogue was changed.

No published A100 table by K was found; A100's ``k½`` is the formula's, not checked here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from megatron_ext.estimate.hardware import get_profile
from megatron_ext.estimate.kernels import GEMM_TILE_FIXED_S, gemm_depth_half, gemm_shape_efficiency

pytestmark = pytest.mark.unit

H800_SMS = 132
"""H800 SXM has H100 SXM's 132 multiprocessors and its dense peaks (989 bf16, 1979 FP8 TFLOP/s)."""
H100_BF16_PEAK = 989e12
H100_FP8_PEAK = 1979e12


@dataclass(frozen=True)
class GemmTable:
    """Published rates of one GEMM kernel by shape."""

    source: str
    """Where the numbers are published (repository, path and commit)."""
    precision: str
    """``bf16`` (or fp16: the same tensor-core rate) or ``fp8``."""
    rows: tuple[tuple[int, int, int, float], ...]
    """(M, N, K, TFLOP/s as published); for a batched GEMM, M is the batch count times the rows of one."""

    def ratios(self, depth_half: float, sms: int = H800_SMS) -> list[tuple[int, int, int, float, float]]:
        """Each row's (M, N, K, measured, modelled) rate relative to the deepest row's."""
        ref = max(self.rows, key=lambda r: r[2])
        model_ref = gemm_shape_efficiency(*ref[:3], sms=sms, depth_half=depth_half)
        return [
            (m, n, k, tflops / ref[3], gemm_shape_efficiency(m, n, k, sms=sms, depth_half=depth_half) / model_ref)
            for m, n, k, tflops in self.rows
        ]

    def residuals(self, depth_half: float) -> dict[int, float]:
        """Modelled ratio over measured ratio, minus 1, by K."""
        return {k: model / measured - 1 for _, _, k, measured, model in self.ratios(depth_half)}


def _k_sweep(m: int, n: int, ks: tuple[int, ...], tflops: tuple[float, ...]) -> tuple[tuple[int, int, int, float], ...]:
    return tuple((m, n, k, t) for k, t in zip(ks, tflops, strict=True))


_TILELANG_K = (256, 512, 1024, 2048, 4096, 8192, 16384)

TILELANG_FP16_H800 = GemmTable(
    source="tile-ai/tilelang benchmark/matmul/README.md, commit b2acfc3791d5ddeef3772214222461c85659c904: "
    "the autotuned FP16 matmul (fp32 accumulation, fp16 output), M = N = 8192, on H800 SXM",
    precision="bf16",
    rows=_k_sweep(8192, 8192, _TILELANG_K, (386, 520, 628, 705, 736, 758, 766)),
)
TILELANG_FP8_H800 = GemmTable(
    source="tile-ai/tilelang benchmark/matmul_fp8/README.md, commit b2acfc3791d5ddeef3772214222461c85659c904: "
    "the autotuned FP8 (e4m3) matmul, e4m3 output, M = N = 8192, on H800 SXM",
    precision="fp8",
    rows=_k_sweep(8192, 8192, _TILELANG_K, (569, 858, 1129, 1343, 1467, 1507, 1541)),
)
TILELANG_FP8_H800_BEFORE = GemmTable(
    source="tile-ai/tilelang benchmark/matmul_fp8/README.md, commit fb8b3afa0a222d4a93ac2497d104769d4156dae9: the "
    "same benchmark before b2acfc37 gave its output tile a swizzled shared-memory layout (its only kernel change)",
    precision="fp8",
    rows=_k_sweep(8192, 8192, _TILELANG_K, (376, 622, 927, 1174, 1378, 1461, 1523)),
)

# XLA's default matmul performance table (measured; flops in FLOP/s, here in TFLOP/s to two decimals):
# bf16 × bf16 → bf16 on "sm_90", batch b of 4096 × 4096 outputs.
_XLA_K = (256, 512, 1024, 2048, 4096)
_XLA = "tensorflow/tensorflow third_party/xla/xla/service/gpu/model/matmul_interpolator_data.h, commit "
_XLA += "372d578bb861cc5804e56d37d93aec931a59762c: kDefaultMatmulPTable, sm_90, bf16xbf16->bf16, m = n = 4096, b = "
XLA_SM90_BF16 = {
    b: GemmTable(source=f"{_XLA}{b}", precision="bf16", rows=_k_sweep(4096 * b, 4096, _XLA_K, tflops))
    for b, tflops in (
        (1, (392.16, 543.12, 677.44, 738.74, 783.33)),
        (2, (464.02, 607.67, 692.97, 763.01, 807.67)),
        (4, (503.87, 619.86, 725.51, 764.58, 793.13)),
    )
}

DEEPGEMM_H800 = GemmTable(
    source="deepseek-ai/DeepGEMM README.md, commit 327ec92f6977e7fee022cb76a8f273b75483c3d8, 'Normal GEMMs for "
    "dense models', the M = 4096 rows: FP8 with fine-grained scaling, bf16 output, H800 SXM5",
    precision="fp8",
    rows=(
        (4096, 2112, 7168, 1127),
        (4096, 24576, 1536, 1212),
        (4096, 32768, 512, 775),
        (4096, 7168, 16384, 1520),
        (4096, 4096, 7168, 1410),
        (4096, 7168, 2048, 1168),
    ),
)

BF16_DEPTH = gemm_depth_half(H100_BF16_PEAK, H800_SMS)
FP8_DEPTH = gemm_depth_half(H100_FP8_PEAK, H800_SMS)

DEEP_K = 1024
"""From here up the depths a training step's GEMMs have (hidden sizes and tokens per micro-batch ≥ 1024)."""
DEEP_TOLERANCE = 0.07
"""Modelled against measured rate ratio, for K ≥ ``DEEP_K``."""
SHALLOW_TOLERANCE = 0.17
"""K of 256 and 512: a whole 4096 × 4096 × 256 GEMM takes 22 µs on H100, and the kernel's own start and end,
which the per-tile model does not have, show (cuBLAS at batch 1 is 7 % slower there than the model, at batch 4
16 % faster)."""
DEEPGEMM_TOLERANCE = 0.11
"""DeepGEMM's rows also differ in N, and so in waves: it picks its block sizes per shape (not 128 × 128) to fill
the last wave, which the model's 128 × 128 tiles do not."""


def _fitted_depth(table: GemmTable) -> float:
    """The ``k½`` (even, 0–2000) whose largest residual over ``table`` is smallest."""
    return min(range(0, 2001, 2), key=lambda h: max(abs(r) for r in table.residuals(h).values()))


def test_the_tile_fixed_time_is_the_fit_to_tilelangs_fp16_table() -> None:
    """The fit source: ``GEMM_TILE_FIXED_S`` gives the ``k½`` of the minimax fit to the FP16 sweep (to the
    rounding of the time to 0.1 µs)."""
    fitted = _fitted_depth(TILELANG_FP16_H800)
    assert fitted == 252
    assert abs(BF16_DEPTH / fitted - 1) < 0.05e-6 / GEMM_TILE_FIXED_S
    assert max(abs(r) for r in TILELANG_FP16_H800.residuals(BF16_DEPTH).values()) < 0.02


@pytest.mark.parametrize("batch", sorted(XLA_SM90_BF16))
def test_cublas_on_hopper_follows_the_depth_term(batch: int) -> None:
    """Validation: cuBLAS's bf16 rates by K (never fitted) against the model's, relative to K = 4096."""
    residuals = XLA_SM90_BF16[batch].residuals(BF16_DEPTH)
    for k, r in residuals.items():
        assert abs(r) < (DEEP_TOLERANCE if k >= DEEP_K else SHALLOW_TOLERANCE), f"K = {k}: {r:+.1%}"


def test_fp8_doubles_the_depth_and_tilelangs_fp8_table_follows() -> None:
    """Validation: FP8's ``k½`` is the bf16 one at twice the rate; the FP8 sweep (never fitted) follows it, and
    would not with bf16's ``k½`` (39 % off at K = 256, 11 % at 1024)."""
    assert abs(FP8_DEPTH / (2 * BF16_DEPTH) - 1) < 0.01
    residuals = TILELANG_FP8_H800.residuals(FP8_DEPTH)
    assert max(abs(r) for r in residuals.values()) < DEEP_TOLERANCE, residuals
    assert TILELANG_FP8_H800.residuals(BF16_DEPTH)[1024] > 0.10


def test_deepgemms_fp8_shapes_follow_the_shape_model() -> None:
    """Validation: DeepGEMM's M = 4096 rows (K from 512 to 16384, N from 2112 to 32768) relative to its deepest;
    its shallowest (K = 512) is 36 % off with bf16's ``k½``."""
    residuals = DEEPGEMM_H800.residuals(FP8_DEPTH)
    assert max(abs(r) for r in residuals.values()) < DEEPGEMM_TOLERANCE, residuals
    assert DEEPGEMM_H800.residuals(BF16_DEPTH)[512] > 0.3


def test_the_fixed_cost_is_the_epilogues() -> None:
    """Evidence for the form: changing only the epilogue's shared-memory layout moved tilelang's FP8 ``k½`` from
    about 800 to about 440, and FP8 at twice FP16's rate has a ``k½`` 1.5–2 times FP16's (a fixed time: the
    output bytes halve, e4m3 against fp16, and ``k½`` does not)."""
    before, after = _fitted_depth(TILELANG_FP8_H800_BEFORE), _fitted_depth(TILELANG_FP8_H800)
    assert before > 1.6 * after
    assert 1.5 < after / _fitted_depth(TILELANG_FP16_H800) < 2.0


def test_the_profiles_derive_their_depth_from_the_tiles_fixed_time() -> None:
    """``GpuProfile.depth_half``: the formula at the GEMMs' peak (FP8 doubles it); a number given in the profile
    overrides it for bf16 and scales with the peak."""
    h100, a100 = get_profile("h100-sxm"), get_profile("a100-80g")
    assert h100.depth_half() == pytest.approx(BF16_DEPTH)
    assert h100.peak_flops_fp8 is not None
    assert h100.depth_half(h100.peak_flops_fp8) == pytest.approx(2 * h100.depth_half(), rel=0.01)
    assert get_profile("h200").depth_half() == pytest.approx(h100.depth_half())  # the same SMs and peak
    assert a100.depth_half() == pytest.approx(97, abs=1)  # 312 TFLOP/s over 108 SMs
    given = dataclasses.replace(h100, gemm_depth_half=300.0)
    assert given.depth_half() == 300.0
    assert given.depth_half(2 * h100.peak_flops) == 600.0
    assert dataclasses.replace(h100, gemm_depth_half=0.0).depth_half(h100.peak_flops_fp8) == 0.0
