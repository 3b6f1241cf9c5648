"""bench/tp_overlap_share.py's figures (docs/layout-model.md, Tensor parallelism): with ``--tp-comm-overlap`` priced
as hiding a share of what the estimate's rule hides and the H100 constants the benchmark fitted at that share, how
many validation rows pass 10 %, and the 405B recipe's H200 TP 4 / H100 TP 8 pair. The benchmark runs the fits
(a grid over the calibration rows, half a minute); this takes its constants and checks what they give."""

from __future__ import annotations

import statistics

import pytest

from megatron_ext.estimate.hardware import GpuProfile, get_profile
from tests.conftest import script_module
from tests.estimate.published import (
    CALIBRATION,
    MLPERF_V50_LLAMA_405B,
    MLPERF_V51_LLAMA_405B_H200,
    VALIDATION,
    with_constants,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("share", "gemms", "element_wise", "over", "largest", "ratio"),
    [(1.0, 0.63, 0.82, 0, 0.094, 0.958), (0.9, 0.64, 0.74, 2, 0.111, 0.945), (0.8, 0.645, 0.88, 1, 0.103, 0.938),
     (0.7, 0.66, 0.64, 15, 0.139, 0.922), (0.6, 0.665, 0.76, 17, 0.129, 0.916)],
)  # fmt: skip
def test_only_the_rules_whole_share_keeps_every_validation_row_within_ten_percent(
    share: float, gemms: float, element_wise: float, over: int, largest: float, ratio: float
) -> None:
    def profile(gpu: str) -> GpuProfile:
        base = get_profile(gpu)
        if gpu in ("h100-sxm", "h200"):
            return with_constants(base, compute_efficiency=gemms, memory_efficiency=element_wise)
        return base

    with script_module("bench/tp_overlap_share.py", "tp_overlap_share").hidden_share(share):
        calibration = [abs(r.residual(profile(r.gpu))) for r in CALIBRATION if r.gpu.startswith("h100")]
        sizes = [abs(r.residual(profile(r.gpu))) for r in VALIDATION]
        h100 = next(r for r in MLPERF_V50_LLAMA_405B if r.gpus == 512)
        h200 = next(r for r in MLPERF_V51_LLAMA_405B_H200 if r.gpus == 512)
        estimated = h200.estimate(profile("h200")).time.step_s / h100.estimate(profile("h100-sxm")).time.step_s
    assert 0.036 <= round(max(calibration), 3) <= 0.038  # every share fits the calibration rows as well
    assert sum(s > 0.10 for s in sizes) == over and round(max(sizes), 3) == largest
    assert round(estimated, 3) == ratio and round(h200.step_s / h100.step_s, 3) == 0.907  # type: ignore[operator]
    assert statistics.median(sizes) < 0.035
