"""docs/layout-model.md's figures are what the calculator gives today: the residual table, the data-parallel growth
table and the accuracy summary beside other tools. A change of the model that moves a figure fails here until
the docs are regenerated (``bench/calibrate_time_model.py --markdown``) and the summary is restated."""

from __future__ import annotations

import statistics

import pytest

from tests.conftest import REPO
from tests.estimate.published import (
    ALL,
    CALIBRATION,
    COMPARISON,
    DGXC_H100,
    VALIDATION,
    data_parallel_growth,
    residual_table,
)

pytestmark = pytest.mark.unit

DOC = REPO / "docs" / "layout-model.md"


def _table_after(header: str) -> list[str]:
    """The markdown table of the docs whose header line is ``header``: that line and the rows under it."""
    lines = DOC.read_text().splitlines()
    start = lines.index(header)
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return lines[start:end]


def _signed(fraction: float) -> str:
    """``+1.5%`` / ``−0.1%``: the docs' typography (a minus sign, not a hyphen)."""
    return f"{fraction:+.1%}".replace("-", "−")


def test_the_residual_table_is_the_calculator_s() -> None:
    expected = residual_table(ALL)
    documented = _table_after(expected[0])
    changed = [f"docs: {d}\nnow:  {e}" for d, e in zip(documented, expected, strict=False) if d != e]
    assert len(documented) == len(expected) and not changed, (
        f"{len(documented) - 2} rows in the docs, {len(expected) - 2} published; first differences:\n"
        + "\n".join(changed[:5])
        + "\nregenerate with: python bench/calibrate_time_model.py --markdown"
    )


def test_the_data_parallel_growth_table_is_the_calculator_s() -> None:
    expected = [
        f"| {model} | {first} → {last} | {_signed(measured)} | {_signed(predicted)} |"
        for model, first, last, measured, predicted in data_parallel_growth(DGXC_H100)
    ]
    header = "| model | GPUs | measured | predicted |"
    assert _table_after(header)[2:] == expected


def test_the_accuracy_summary_states_the_tables_figures() -> None:
    """The validation headline, the calibration figures and the "beside other tools" table: how many rows,
    their median and largest (in size) or range."""
    text = DOC.read_text()
    validation = [r.residual() for r in VALIDATION]
    sizes = [abs(x) for x in validation]
    stated = (
        f"Validation: {len(VALIDATION)} rows, largest residual {max(sizes):.1%}",
        f"median {statistics.median(sizes):.1%}.**",
        f"{len(VALIDATION)} published validation rows never fitted",
        f"median {statistics.median(sizes):.1%}, largest {max(sizes):.1%} of step time",
    )
    for gpu, name in (("a100", "A100"), ("h100", "H100")):
        fitted = [abs(r.residual()) for r in CALIBRATION if r.gpu.startswith(gpu)]
        stated += (f"{name} within {max(fitted):.1%} (median {statistics.median(fitted):.1%})",)
    comparison = [r.residual() for r in COMPARISON]
    stated += (
        f"{len(COMPARISON)} published rows listed, not validated",
        f"median {statistics.median(abs(x) for x in comparison):.1%}, "
        f"from {_signed(min(comparison))} to {_signed(max(comparison))}",
    )
    stated = tuple(s.replace("%", " %") for s in stated)  # the summary's typography: "2.0 %"
    missing = [s for s in stated if s not in text]
    assert not missing, missing
