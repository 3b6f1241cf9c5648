#!/usr/bin/env python3
"""How much of each tensor-parallel collective ``--tp-comm-overlap`` hides, as far as the published runs tell.

The estimate hides all of a collective that the layer's GEMMs can cover but its first chunk
(``step_time._tp_collectives_seconds``: an upper bound). No Megatron or NeMo layout is published measured with the
overlap and without, so this asks the runs that used it instead: for each share of that hidden part (1: the
estimate's rule), the H100 constants are fitted again on their calibration rows (the same minimax grid as
``calibrate_time_model.py``) and every validation row is evaluated, with the pair that differs in TP alone within
one software release (MLPerf's Llama 3.1 405B recipe on NeMo 25.01: v5.0's H100s at TP 8, v5.1's H200s at TP 4, 512
GPUs each) beside them. The figures go into docs/layout-model.md::

    python bench/tp_overlap_share.py
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import statistics
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from megatron_ext.estimate import step_time
from megatron_ext.estimate.hardware import GpuProfile, get_profile

SHARES = (1.0, 0.9, 0.8, 0.7, 0.6)
"""Shares of the rule's hidden part tried (1: the estimate's rule)."""


def _calibrate_time_model() -> Any:
    """bench/calibrate_time_model.py (a script, not a package): its fit and the published tables it loads."""
    path = Path(__file__).resolve().parent / "calibrate_time_model.py"
    spec = importlib.util.spec_from_file_location("calibrate_time_model", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextmanager
def hidden_share(share: float) -> Iterator[None]:
    """Price ``--tp-comm-overlap`` as hiding ``share`` of what the estimate's rule hides."""
    rule: Callable[..., float] = step_time._tp_collectives_seconds

    def priced(workload: Any, gpu: GpuProfile, layout: Any, *, seq_length: float, layer_gemm_s: float) -> float:
        by_rule = rule(workload, gpu, layout, seq_length=seq_length, layer_gemm_s=layer_gemm_s)
        if not workload.tp_comm_overlap:
            return by_rule
        unhidden = rule(
            dataclasses.replace(workload, tp_comm_overlap=False), gpu, layout, seq_length=seq_length,
            layer_gemm_s=layer_gemm_s,
        )  # fmt: skip
        return unhidden - share * (unhidden - by_rule)

    step_time._tp_collectives_seconds = priced
    try:
        yield
    finally:
        step_time._tp_collectives_seconds = rule


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shares", type=float, nargs="+", default=list(SHARES), help="Shares to try.")
    args = parser.parse_args(argv)
    calibrate = _calibrate_time_model()
    published = calibrate._tables
    h100 = get_profile("h100-sxm")
    rows = [r for r in published.CALIBRATION if r.gpu.startswith("h100")]
    h100_tp8 = next(r for r in published.MLPERF_V50_LLAMA_405B if r.gpus == 512)
    h200_tp4 = next(r for r in published.MLPERF_V51_LLAMA_405B_H200 if r.gpus == 512)
    measured = h200_tp4.step_s / h100_tp8.step_s
    print(
        "share  GEMMs  element-wise  calibration largest  validation median  largest  over 10%  "
        f"405B H200 TP 4 / H100 TP 8 (measured {measured:.3f})"
    )
    for share in args.shares:
        with hidden_share(share):
            fitted, error = calibrate.minimax(rows, h100, calibrate.H100_GRID)

            def profile(gpu: str, fitted: dict[str, float] = fitted) -> GpuProfile:
                base = get_profile(gpu)
                return published.with_constants(base, **fitted) if gpu in ("h100-sxm", "h200") else base

            sizes = [abs(r.residual(profile(r.gpu))) for r in published.VALIDATION]
            ratio = h200_tp4.estimate(profile("h200")).time.step_s / h100_tp8.estimate(profile("h100-sxm")).time.step_s
        print(
            f"{share:5.2f}  {fitted['compute_efficiency']:5.3f}  {fitted['memory_efficiency']:12.2f}  {error:19.1%}  "
            f"{statistics.median(sizes):17.1%}  {max(sizes):7.1%}  {sum(s > 0.10 for s in sizes):8d}  {ratio:.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
