"""docs/layout-model.md's figures are what the calculator gives today: the residual table, the later dgxc releases'
table, the data-parallel growth table and the accuracy figures (the validation headline, the calibration, the
first sources, the short microbatches, the summary beside other tools). A change of the model that moves a figure fails here until
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
    DGXC_LATER_RELEASES,
    KORTHIKANTI_2022,
    MEGATRON_LM_A100_175B,
    VALIDATION,
    data_parallel_growth,
    measured_again,
    measured_again_table,
    residual_table,
    spread,
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
    their median and largest (in size) or range. Line breaks in the prose are spaces."""
    text = " ".join(DOC.read_text().split())
    validation = [r.residual() for r in VALIDATION]
    sizes = [abs(x) for x in validation]
    stated = (
        f"Validation: {len(VALIDATION)} rows, largest residual {max(sizes):.1%}",
        f"median {statistics.median(sizes):.1%}.**",
        f"{len(VALIDATION)} published validation rows never fitted",
        f"median {statistics.median(sizes):.1%}, largest {max(sizes):.1%} of step time",
    )
    first = [abs(r.residual()) for r in VALIDATION if r in KORTHIKANTI_2022 + MEGATRON_LM_A100_175B + DGXC_H100]
    stated += (
        f"The {len(first)} rows of the first sources (A100 and dgxc v24.11.1) have a median of "
        f"{statistics.median(first):.1%} and a largest residual of {max(first):.1%}",
    )
    short = [abs(r.residual()) for r in VALIDATION + CALIBRATION if r.micro_batch * r.seq_length / r.cp <= 2048]
    stated += (f"{len(short)} rows, A100 and H100): median {statistics.median(short):.1%}, largest {max(short):.1%}",)
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


def test_the_later_releases_table_is_the_calculator_s() -> None:
    """Each later dgxc-benchmarking table's row count, median, largest residual (and its run) and signs, and the
    releases' headline."""
    rows = [r for table in DGXC_LATER_RELEASES.values() for r in table]
    sizes = [abs(r.residual()) for r in rows]
    headline = f"({len(rows)} rows, median {statistics.median(sizes):.1%}, largest {max(sizes):.1%})"
    assert headline.replace("%", " %") in DOC.read_text()
    documented = _table_after("| release (tag) | NeMo | precision | rows | median | largest | sign |")[2:]
    assert len(documented) == len(DGXC_LATER_RELEASES)
    for line in documented:
        tag, _, precision, *figures = (cell.strip() for cell in line.strip("|").split("|"))
        (table,) = [t for t in DGXC_LATER_RELEASES if f" {tag}," in t and t.endswith(precision)]
        residuals = {r.name: r.residual() for r in DGXC_LATER_RELEASES[table]}
        largest = max(residuals, key=lambda name: abs(residuals[name]))
        negative = sum(x < 0 for x in residuals.values())
        expected = [
            str(len(residuals)),
            f"{statistics.median(abs(x) for x in residuals.values()):.1%}".replace("%", " %"),
            f"{_signed(residuals[largest])} ({largest})".replace("%", " %"),
            f"{negative} of {len(residuals)} negative",
        ]
        assert figures == expected, (table, figures, expected)


def test_the_same_runs_measured_again_are_the_tables_runs() -> None:
    """The runs more than one table measured: how many, their spread, and the widest six."""
    groups = measured_again(ALL)
    spreads = [spread(group) for group in groups]
    text = " ".join(DOC.read_text().split())
    stated = (
        f"{len(groups)} of the runs above are ones the calculator cannot tell apart",
        f"{sum(len(group) for group in groups)} measurements in all",
        f"differ by a median of {statistics.median(spreads):.1%} and by up to {max(spreads):.1%}",
    )
    missing = [s for s in (s.replace("%", " %") for s in stated) if s not in text]
    assert not missing, missing
    expected = measured_again_table(groups[:6])
    assert _table_after(expected[0]) == expected
