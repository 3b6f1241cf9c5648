#!/usr/bin/env python3
"""Fit the GPU profiles' efficiency constants to the calibration rows, and print every row's residual.

The calibration and validation tables are ``tests/estimate/published.py`` (with their sources). Each fit is
the minimax over a grid: the constants whose largest calibration residual is smallest. Validation rows are
only evaluated. The residual table this prints is the one in ``docs/layout-model.md``::

    python bench/calibrate_time_model.py            # fit, compare with the shipped constants, print residuals
    python bench/calibrate_time_model.py --markdown # the residual table only, as markdown
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from megatron_ext.estimate.hardware import GpuProfile, get_profile


def _published() -> ModuleType:
    """``tests/estimate/published.py``, loaded from its path: the tables live beside the tests that check them,
    and ``tests`` is not an installed package."""
    path = Path(__file__).resolve().parent.parent / "tests" / "estimate" / "published.py"
    spec = importlib.util.spec_from_file_location("tests.estimate.published", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


if TYPE_CHECKING:
    from tests.estimate.published import ALL, CALIBRATION, PublishedRun, residual_table, with_constants, worst
else:
    _tables = _published()
    ALL, CALIBRATION = _tables.ALL, _tables.CALIBRATION
    residual_table, with_constants, worst = _tables.residual_table, _tables.with_constants, _tables.worst

A100_GRID = {
    "compute_efficiency": [round(0.60 + 0.01 * i, 2) for i in range(31)],
    "memory_efficiency": [round(0.50 + 0.02 * i, 2) for i in range(21)],
}
"""A100: the GEMMs' best share of peak and the element-wise kernels' share of HBM bandwidth (unfused attention).
The GEMMs' shape losses are not fitted: they come from GEMM benchmarks by shape (``estimate.kernels``)."""
H100_GRID = {
    "compute_efficiency": [round(0.55 + 0.005 * i, 3) for i in range(31)],
    "memory_efficiency": [round(0.50 + 0.02 * i, 2) for i in range(24)],
}
"""H100: the GEMMs' best share of peak and the element-wise kernels' share of HBM bandwidth (fused attention's share
and the GEMMs' shape losses come from kernel benchmarks, ``estimate.kernels``)."""


def minimax(rows: list[PublishedRun], gpu: GpuProfile, grid: dict[str, list[float]]) -> tuple[dict[str, float], float]:
    """The grid point whose largest residual over ``rows`` is smallest, and that residual."""
    best: tuple[float, dict[str, float]] | None = None
    for values in itertools.product(*grid.values()):
        constants = dict(zip(grid, values, strict=True))
        error = worst(rows, with_constants(gpu, **constants))
        if best is None or error < best[0]:
            best = (error, constants)
    assert best is not None
    return best[1], best[0]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--markdown", action="store_true", help="Print only the residual table.")
    args = parser.parse_args(argv)
    if args.markdown:
        print("\n".join(residual_table(ALL)))
        return 0
    a100 = get_profile("a100-80g")
    a100_rows = [r for r in CALIBRATION if r.gpu.startswith("a100")]
    fitted, error = minimax(a100_rows, a100, A100_GRID)
    shipped = {name: getattr(a100, name) for name in A100_GRID}
    print(f"A100 fit on {len(a100_rows)} rows: {fitted} (largest residual {error:.2%}); shipped {shipped}")
    h100 = get_profile("h100-sxm")
    h100_rows = [r for r in CALIBRATION if r.gpu.startswith("h100")]
    fitted, error = minimax(h100_rows, h100, H100_GRID)
    shipped = {name: getattr(h100, name) for name in H100_GRID}
    print(f"H100 fit on {len(h100_rows)} rows: {fitted} (largest residual {error:.2%}); shipped {shipped}")
    print("\n".join(residual_table(ALL)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
