"""The metrics file (``pretrain_gpt.py --metrics-file``): its format, and its one reader (``read_metrics_file``).

One JSON object per line, appended to by every start of a run (the first, and each resume after a stop, a crash
or a requeue). A start writes first of all its **start record**, ``{"run_record": {...}}``: what ran and where
(``calibration.run_record``) and its marks (``start_marks``):

* ``start``: how many start records the file held before this one (0 for the first start);
* ``resumed_from_iteration``: the iteration of the checkpoint this start continued from (0: from scratch);
* ``started_at``: when it started, ISO 8601 in UTC (``2026-05-01T12:00:00+00:00``).

Then, under it, the start's **rows**: one every ``--log-interval`` (``iteration``, ``lm_loss``, ``elapsed_ms``,
...), one per evaluation (``valid_loss``), events (``checkpoint_skipped``; the elastic launcher's ``relayout``)
and the run's summary.

**Superseded rows.** A start that resumes from iteration 20 after a crash at 27 trains 21–27 again: the rows of
an earlier start whose ``iteration`` is past a later start's ``resumed_from_iteration`` are superseded, and the
run that continued is made of the others. ``read_metrics_file`` returns that run's rows and every row flagged.

**Files written before the marks** have start records without them. Such a start's resume iteration is taken as
one before the first training iteration it logged: a lower bound of the true one, so that only rows it certainly
logged again are superseded; a start that logged none supersedes nothing.

**A line cut short** (a crash in the middle of a write) is skipped and reported when it is the last line of a
start's rows (the next start begins on a new line: ``MetricsWriter``); anywhere else it is an error.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RUN_RECORD = "run_record"
"""The key of a start record: what ran, where, and which start it is (``calibration.run_record``, ``start_marks``)."""

START = "start"
"""The start record's mark: how many start records the file held before it."""
RESUMED_FROM_ITERATION = "resumed_from_iteration"
"""The start record's mark: the checkpoint's iteration the start continued from (0: from scratch)."""
STARTED_AT = "started_at"
"""The start record's mark: its wall-clock time, ISO 8601 in UTC."""

ITERATION = "iteration"
"""A row's iteration: the iterations trained when it was written (a training row: the last of its window)."""
TRAINING_LOSS = "lm_loss"
"""A training row's loss (the mean over its log window; ``null`` when not finite)."""
VALIDATION_LOSS = "valid_loss"
"""An evaluation row's loss on the validation split."""


class MetricsFileError(ValueError):
    """A file that cannot be read as a metrics file; the message names the file (and line), and what to do."""


def start_marks(*, start: int, resumed_from_iteration: int, started_at: float) -> dict[str, Any]:
    """The marks a start record carries (module docstring); ``started_at``: seconds since the epoch."""
    return {
        START: start,
        RESUMED_FROM_ITERATION: resumed_from_iteration,
        STARTED_AT: datetime.fromtimestamp(started_at, UTC).isoformat(timespec="seconds"),
    }


def starts_in(path: Path) -> int:
    """How many start records ``path`` holds (0 when it does not exist): the ``start`` mark of the next one."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return sum(1 for line in f if f'"{RUN_RECORD}"' in line and RUN_RECORD in (_object(line) or {}))
    except FileNotFoundError:
        return 0


@dataclass(frozen=True, kw_only=True)
class Start:
    """One start of the run: its record, and the iteration it continued from."""

    index: int
    """Its place among the file's start records, from 0 (as its ``start`` mark says, in a file nobody edited)."""
    line: int
    """The line of its record, from 1."""
    record: dict[str, Any]
    """The start record's contents (``calibration.run_record`` and the marks)."""
    marked: bool
    """Whether the record has the marks; False: written before them (``resumed_from_iteration`` inferred)."""
    resumed_from_iteration: int | None
    """The iteration it continued from: the mark, or for an unmarked record one before the first training
    iteration it logged (None: it logged none, and supersedes nothing)."""
    started_at: datetime | None
    """Its wall-clock time (None: an unmarked record)."""


@dataclass(frozen=True, kw_only=True)
class Row:
    """One line of the file other than a start record."""

    line: int
    """Its line, from 1."""
    start: int | None
    """The ``Start.index`` of the start record above it (None: above the first one)."""
    values: dict[str, Any]
    """The line's object as written."""
    superseded: bool
    """A later start resumed from an iteration before this row's: the run that continued logged it again."""

    @property
    def iteration(self) -> int | None:
        value = self.values.get(ITERATION)
        return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True, kw_only=True)
class MetricsFile:
    """A metrics file as read by ``read_metrics_file``: its starts, and every row flagged."""

    path: Path
    starts: tuple[Start, ...]
    all_rows: tuple[Row, ...]
    """Every row in file order, superseded ones included (``Row.superseded``)."""
    cut_lines: tuple[int, ...]
    """Lines cut short by a crash, skipped (module docstring)."""

    @property
    def rows(self) -> list[dict[str, Any]]:
        """The run that continued: the values of every row no later start superseded, in file order."""
        return [row.values for row in self.all_rows if not row.superseded]


def read_metrics_file(path: Path) -> MetricsFile:
    """``path`` read: its starts, the rows of the run that continued (``MetricsFile.rows``) and every row with
    its start and whether a later start superseded it (``MetricsFile.all_rows``). A MetricsFileError names the
    file, the line and the fix when it is not a metrics file."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise MetricsFileError(
            f"{path}: cannot read it ({exc.strerror or exc}); give the path of a pretrain_gpt.py --metrics-file"
        ) from None
    lines = raw.decode("utf-8", errors="replace").split("\n")
    ends_cut = bool(lines) and lines[-1] != ""  # no newline after the last line: a write cut short
    numbered = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]
    parsed: list[tuple[int, dict[str, Any]]] = []
    cut: list[int] = []
    for position, (number, line) in enumerate(numbered):
        value = _object(line)
        if value is None:
            following = numbered[position + 1][1] if position + 1 < len(numbered) else None
            last_of_file = following is None and ends_cut
            if last_of_file or (following is not None and RUN_RECORD in (_object(following) or {})):
                cut.append(number)
                continue
            raise MetricsFileError(
                f"{path}, line {number}: {_what_is_wrong(line)}; a metrics file holds one JSON object per line, as "
                "pretrain_gpt.py --metrics-file writes it"
            )
        parsed.append((number, value))
    if not any(RUN_RECORD in value or _is_int(value.get(ITERATION)) for _, value in parsed):
        raise MetricsFileError(
            f"{path}: not a metrics file: none of its {len(numbered)} line(s) holds a {RUN_RECORD} or an "
            f"{ITERATION}; give the file a pretrain_gpt.py run wrote with --metrics-file"
        )
    return _flagged(path, parsed, tuple(cut))


def _flagged(path: Path, parsed: list[tuple[int, dict[str, Any]]], cut: tuple[int, ...]) -> MetricsFile:
    """Starts and rows of the parsed lines, each row flagged as superseded or not."""
    records: list[tuple[int, dict[str, Any]]] = []
    rows: list[tuple[int, int | None, dict[str, Any]]] = []
    for number, value in parsed:
        if RUN_RECORD in value:
            record = value[RUN_RECORD]
            if not isinstance(record, dict):
                raise MetricsFileError(f"{path}, line {number}: its {RUN_RECORD} is not a JSON object")
            records.append((number, record))
        else:
            rows.append((number, len(records) - 1 if records else None, value))
    starts = [_start(path, index, number, record, rows) for index, (number, record) in enumerate(records)]
    # A row is superseded when a start recorded after it resumed from an earlier iteration.
    flagged: list[Row] = []
    earliest_later: float = math.inf
    record_lines = [(start.line, start.resumed_from_iteration) for start in starts]
    for number, start, values in reversed(rows):
        while record_lines and record_lines[-1][0] > number:
            resumed = record_lines.pop()[1]
            if resumed is not None:
                earliest_later = min(earliest_later, resumed)
        iteration = values.get(ITERATION)
        superseded = _is_int(iteration) and iteration > earliest_later
        flagged.append(Row(line=number, start=start, values=values, superseded=superseded))
    flagged.reverse()
    return MetricsFile(path=path, starts=tuple(starts), all_rows=tuple(flagged), cut_lines=cut)


def _start(
    path: Path, index: int, number: int, record: dict[str, Any], rows: list[tuple[int, int | None, dict[str, Any]]]
) -> Start:
    """The start whose record is ``record`` (on line ``number``); ``rows``: the file's rows, for an unmarked one."""
    if RESUMED_FROM_ITERATION not in record:
        logged = [v[ITERATION] for _, s, v in rows if s == index and TRAINING_LOSS in v and _is_int(v.get(ITERATION))]
        return Start(
            index=index,
            line=number,
            record=record,
            marked=False,
            resumed_from_iteration=min(logged) - 1 if logged else None,
            started_at=None,
        )
    resumed, started_at = record[RESUMED_FROM_ITERATION], record.get(STARTED_AT)
    if not _is_int(resumed) or resumed < 0:
        raise MetricsFileError(
            f"{path}, line {number}: {RESUMED_FROM_ITERATION} is {resumed!r}, not an iteration (an integer >= 0)"
        )
    try:
        when = datetime.fromisoformat(started_at) if isinstance(started_at, str) else None
    except ValueError:
        when = None
    if when is None:
        raise MetricsFileError(f"{path}, line {number}: {STARTED_AT} is {started_at!r}, not an ISO 8601 time")
    return Start(index=index, line=number, record=record, marked=True, resumed_from_iteration=resumed, started_at=when)


def _object(line: str) -> dict[str, Any] | None:
    """The JSON object on ``line``; None when it holds none."""
    try:
        value = json.loads(line)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _what_is_wrong(line: str, limit: int = 60) -> str:
    """Why ``line`` holds no JSON object, with its start."""
    shown = repr(line if len(line) <= limit else line[:limit] + "...")
    try:
        value = json.loads(line)
    except json.JSONDecodeError as exc:
        return f"not JSON ({exc.msg} at column {exc.colno}: {shown})"
    kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(value), "a number")
    return f"JSON {kind}, not an object ({shown})"
