"""The metrics file as the logging rank writes it (``training.metrics.MetricsWriter``): each start's record marked
with its number and the iteration it resumed from, on a line of its own after a write a crash cut short."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from megatron_ext.estimate.metrics_file import RUN_RECORD, read_metrics_file
from megatron_ext.training.metrics import MetricsWriter

pytestmark = pytest.mark.unit


def _one_start(path: Path, *, resumed_from: int, last: int) -> None:
    writer = MetricsWriter(enabled=True, metrics_file=str(path))
    writer.write_start({RUN_RECORD: {"world_size": 2}}, resumed_from_iteration=resumed_from)
    for iteration in range(resumed_from + 1, last + 1):
        writer.write({"iteration": iteration, "lm_loss": float(iteration)})
    writer.close()


def test_each_start_is_numbered_and_marks_its_resume(tmp_path: Path) -> None:
    path = tmp_path / "runs" / "m.jsonl"
    before = datetime.now(UTC) - timedelta(seconds=1)
    _one_start(path, resumed_from=0, last=7)
    _one_start(path, resumed_from=5, last=9)
    metrics = read_metrics_file(path)
    assert [(s.record["start"], s.marked, s.resumed_from_iteration) for s in metrics.starts] == [
        (0, True, 0),
        (1, True, 5),
    ]
    assert all(s.started_at is not None and s.started_at >= before.replace(microsecond=0) for s in metrics.starts)
    assert metrics.starts[1].record["world_size"] == 2
    assert [r["iteration"] for r in metrics.rows] == list(range(1, 10))
    assert [r.iteration for r in metrics.all_rows if r.superseded] == [6, 7]


def test_a_start_after_a_cut_write_begins_on_a_line_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    _one_start(path, resumed_from=0, last=3)
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"iteration": 4, "lm_lo')  # the write a kill -9 cut short
    _one_start(path, resumed_from=3, last=5)
    metrics = read_metrics_file(path)
    assert metrics.cut_lines == (5,)
    assert [s.record["start"] for s in metrics.starts] == [0, 1]
    assert [r["iteration"] for r in metrics.rows] == [1, 2, 3, 4, 5]


def test_a_rank_that_does_not_log_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    writer = MetricsWriter(enabled=False, metrics_file=str(path))
    writer.write_start({RUN_RECORD: {}}, resumed_from_iteration=0)
    writer.close()
    assert not path.exists()
