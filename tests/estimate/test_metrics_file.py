"""The metrics file's reader (``estimate.metrics_file.read_metrics_file``) on written files: the run that
continued after resumes, every row flagged, files from before the start marks, lines cut by a crash, and the
files it refuses."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from megatron_ext.estimate.metrics_file import (
    RUN_RECORD,
    MetricsFileError,
    read_metrics_file,
    start_marks,
    starts_in,
)

pytestmark = pytest.mark.unit

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC).timestamp()


def _start(index: int | None, resumed: int | None = None) -> dict[str, Any]:
    """A start record: marked (``index`` given), or as written before the marks (``index`` None)."""
    body: dict[str, Any] = {"calculator_flags": ["--num-layers", "2"], "world_size": 1}
    if index is not None:
        body = start_marks(start=index, resumed_from_iteration=resumed or 0, started_at=T0 + 60 * index) | body
    return {RUN_RECORD: body}


def _train(first: int, last: int) -> list[dict[str, Any]]:
    return [{"iteration": i, "lm_loss": 10.0 - i / 10, "tokens_per_sec": 1000.0} for i in range(first, last + 1)]


def _write(path: Path, lines: list[dict[str, Any]], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines) + tail, encoding="utf-8")
    return path


def _iterations(rows: list[dict[str, Any]], key: str = "lm_loss") -> list[int]:
    return [r["iteration"] for r in rows if key in r]


def test_a_resume_supersedes_the_rows_past_its_iteration(tmp_path: Path) -> None:
    """Crashed at 27 after a checkpoint of 20: the resume logs 21-27 again, and those of the first start go."""
    first = [_start(0), *_train(1, 20), {"iteration": 20, "valid_loss": 8.5}, *_train(21, 27)]
    second = [_start(1, resumed=20), *_train(21, 30), {"iteration": 30, "valid_loss": 7.5}]
    metrics = read_metrics_file(_write(tmp_path / "m.jsonl", first + second))

    assert _iterations(metrics.rows) == list(range(1, 31))
    assert _iterations(metrics.rows, "valid_loss") == [20, 30]  # 20 is the checkpoint's own: not superseded
    superseded = [r for r in metrics.all_rows if r.superseded]
    assert [(r.start, r.iteration) for r in superseded] == [(0, i) for i in range(21, 28)]
    assert [r.line for r in superseded] == list(range(23, 30))  # after the record, 20 rows and the validation
    assert len(metrics.all_rows) == len(first) + len(second) - 2  # nothing dropped, only flagged
    assert [(s.index, s.line, s.marked, s.resumed_from_iteration) for s in metrics.starts] == [
        (0, 1, True, 0),
        (1, len(first) + 1, True, 20),
    ]
    assert metrics.starts[1].started_at == datetime(2026, 5, 1, 12, 1, tzinfo=UTC)
    assert metrics.starts[1].record["calculator_flags"] == ["--num-layers", "2"]


def test_a_fallback_to_an_older_checkpoint_supersedes_every_later_row(tmp_path: Path) -> None:
    """Start 2 falls back to iteration 10 (a damaged newer checkpoint): start 1's rows and start 0's past 10 go."""
    lines = [
        *[_start(0), *_train(1, 27)],
        *[_start(1, resumed=20), *_train(21, 24)],
        *[_start(2, resumed=10), *_train(11, 30)],
    ]
    metrics = read_metrics_file(_write(tmp_path / "m.jsonl", lines))
    assert [(r["iteration"], r["lm_loss"]) for r in metrics.rows] == [
        (r["iteration"], r["lm_loss"]) for r in _train(1, 30)
    ]
    assert {r.start for r in metrics.all_rows if not r.superseded} == {0, 2}
    assert not [r for r in metrics.all_rows if r.start == 1 and not r.superseded]


def test_a_new_run_from_scratch_into_the_same_file_supersedes_all_before_it(tmp_path: Path) -> None:
    metrics = read_metrics_file(_write(tmp_path / "m.jsonl", [_start(0), *_train(1, 5), _start(1), *_train(1, 3)]))
    assert [(r.start, r.iteration) for r in metrics.all_rows if not r.superseded] == [(1, 1), (1, 2), (1, 3)]


def test_a_file_written_before_the_marks_is_read_with_its_resumes_inferred(tmp_path: Path) -> None:
    """No marks: a start resumed from before the first iteration it logged; one that logged none supersedes
    nothing; rows above the first record belong to no start."""
    lines = [
        {"iteration": 0, "event": "relayout"},
        *[_start(None), *_train(1, 27)],
        *[_start(None), *_train(21, 25)],
        _start(None),  # crashed before its first log: nothing known
        *[_start(None), {"iteration": 22, "checkpoint_skipped": 25}, *_train(23, 30)],
    ]
    metrics = read_metrics_file(_write(tmp_path / "old.jsonl", lines))
    assert [(s.marked, s.resumed_from_iteration, s.started_at) for s in metrics.starts] == [
        (False, 0, None),
        (False, 20, None),
        (False, None, None),
        (False, 22, None),
    ]
    assert _iterations(metrics.rows) == list(range(1, 31))
    assert metrics.all_rows[0].start is None and not metrics.all_rows[0].superseded
    assert [r.iteration for r in metrics.all_rows if r.start == 1 and r.superseded] == [23, 24, 25]


def test_lines_cut_by_a_crash_are_skipped_at_the_end_of_a_start(tmp_path: Path) -> None:
    """The writer begins the next start on a line of its own; the file's very last line may lack its newline."""
    text = (
        "".join(json.dumps(line) + "\n" for line in [_start(0), *_train(1, 3)])
        + '{"iteration": 4, "lm_lo\n'
        + "".join(json.dumps(line) + "\n" for line in [_start(1, resumed=3), *_train(4, 5)])
        + '{"iteration": 6, "lm_loss": 9.'
    )
    (tmp_path / "m.jsonl").write_text(text, encoding="utf-8")
    metrics = read_metrics_file(tmp_path / "m.jsonl")
    assert metrics.cut_lines == (5, 9)
    assert _iterations(metrics.rows) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"iteration": 1, "lm_loss": 9.0}\n{"iteration": 2, "lm_lo\n{"iteration": 3}\n', r"line 2: not JSON"),
        ('{"iteration": 1, "lm_loss": 9.0}\nnot json\n', r"line 2: not JSON"),  # ends with its newline: not cut
        ('{"iteration": 1}\n[1, 2]\n{"iteration": 2}\n', r"line 2: JSON an array, not an object"),
        ('{"model": "gpt"}\n{"layers": 2}\n', r"not a metrics file: none of its 2 line\(s\) holds a run_record"),
        ("", r"not a metrics file: none of its 0 line"),
        (json.dumps({RUN_RECORD: [1]}) + "\n", r"line 1: its run_record is not a JSON object"),
        (
            json.dumps({RUN_RECORD: {"resumed_from_iteration": "20", "started_at": "2026-05-01T12:00:00+00:00"}}),
            r"line 1: resumed_from_iteration is '20', not an iteration",
        ),
        (
            json.dumps({RUN_RECORD: {"resumed_from_iteration": 20, "started_at": "noon"}}),
            r"line 1: started_at is 'noon', not an ISO 8601 time",
        ),
    ],
    ids=["cut-mid-start", "text", "array", "other-json", "empty", "record-not-object", "bad-resume", "bad-time"],
)
def test_what_is_not_a_metrics_file_is_refused_naming_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(MetricsFileError, match=message) as caught:
        read_metrics_file(path)
    assert str(caught.value).startswith(str(path))


def test_a_missing_file_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(MetricsFileError, match=r"cannot read it .*give the path of a pretrain_gpt\.py --metrics-file"):
        read_metrics_file(tmp_path / "nothing.jsonl")


def test_the_next_start_is_numbered_by_the_records_already_there(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    assert starts_in(path) == 0
    # A row that merely mentions the key is not a record.
    _write(path, [_start(None), *_train(1, 2), {"iteration": 2, "note": "run_record"}, _start(1, resumed=2)])
    assert starts_in(path) == 2
