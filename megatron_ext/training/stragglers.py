"""Stragglers: ranks consistently slower than the other ranks of their pipeline stage.

Every log window, ``StageTimer.collect`` gives each global rank's compute time
per microbatch (forward + backward, ms) and its pipeline rank. The ranks with
the same pipeline rank (its TP, CP and DP ranks) run the same layers on
microbatches of the same shape, so on identical hardware they take the same
time, within a few percent. A rank ``r`` with pipeline rank ``p`` is **slow**
in a window when::

    compute[r] > (1 + margin) × median(compute[q] for the other ranks q with pipeline rank p)

and a **straggler** once it has been slow in ``windows`` consecutive log
windows ("consistently": one window can be slow from a passing cause, a
garbage collection or a neighbour's job on a shared host). How much slower it
is, ``slower = compute[r] / median − 1``, is reported with it. A window in
which the rank is not slow sets its count back to 0.

* A pipeline rank with a single rank (TP = CP = DP = 1) has no peers: its
  rank cannot be judged, and is never named. Ranks are never compared across
  pipeline stages: stages hold different layers, and their difference is the
  stage imbalance that ``StageCost`` reports.
* TP (and CP) ranks wait for each other inside every layer, so the forward
  and backward times of one TP group are nearly equal: a slow GPU makes its
  whole TP group slow against the other data-parallel replicas, and every rank
  of the group is named. That narrows it to the group (one node, with TP
  within a node); with DP = 1 a slow TP rank is hidden from this rule.
* The default margin, 10%, is several times the spread of ranks doing the
  same work on the same hardware, and well below what a throttled GPU, a
  degraded link or a busy host costs (tens of percent).

Pure and torch-free: the loop owns one :class:`StragglerWatch` and feeds it
each window's times; every rank computes the same answer from the same
gathered times, and the logging rank reports it.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

DEFAULT_MARGIN = 0.10
"""A rank is slow when its compute per microbatch exceeds its peers' median by more than this fraction."""
DEFAULT_WINDOWS = 3
"""Consecutive slow log windows before a rank is named."""
MAX_NAMED_IN_LOG = 8
"""Stragglers named in the log line; the metrics file gets all of them."""


def slow_ranks(compute_ms: Sequence[float], pipeline_ranks: Sequence[int], *, margin: float) -> dict[int, float]:
    """The ranks slow in one window → how much slower than their peers' median (a fraction).

    ``compute_ms[r]`` and ``pipeline_ranks[r]`` are global rank ``r``'s compute
    time per microbatch and its pipeline rank. Rank ``r`` is slow when::

        compute_ms[r] > (1 + margin) × m
        m = median(compute_ms[q] for every q ≠ r with pipeline_ranks[q] = pipeline_ranks[r])

    and its value is ``compute_ms[r] / m − 1``. A rank without peers (the only
    rank of its pipeline rank) is never slow; nor is one whose peers' median is
    not positive (nothing measured).
    """
    if len(compute_ms) != len(pipeline_ranks):
        raise ValueError(f"{len(compute_ms)} compute times for {len(pipeline_ranks)} pipeline ranks")
    if margin <= 0:
        raise ValueError(f"the margin must be positive, not {margin}")
    by_stage: dict[int, list[int]] = {}
    for rank, stage in enumerate(pipeline_ranks):
        by_stage.setdefault(stage, []).append(rank)
    slow = {}
    for ranks in by_stage.values():
        for rank in ranks:
            peers = [compute_ms[q] for q in ranks if q != rank]
            if not peers:
                continue
            median = statistics.median(peers)
            if median > 0 and compute_ms[rank] > (1.0 + margin) * median:
                slow[rank] = compute_ms[rank] / median - 1.0
    return slow


@dataclass(frozen=True)
class Straggler:
    """A rank slow in at least the required number of consecutive windows."""

    rank: int
    """Global rank."""
    pipeline_rank: int
    slower: float
    """Compute per microbatch over the peers' median, minus 1, in the latest window (0.35: 35% slower)."""
    windows: int
    """Consecutive slow windows so far, the latest included."""
    host: str = ""
    """Host name of the rank ("" when unknown)."""

    def as_record(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "rank": self.rank,
            "pipeline_rank": self.pipeline_rank,
            "slower": self.slower,
            "windows": self.windows,
        }
        if self.host:
            record["host"] = self.host
        return record

    def describe(self) -> str:
        host = f", {self.host}" if self.host else ""
        return (
            f"rank {self.rank} (pipeline rank {self.pipeline_rank}{host}) {self.slower:.0%} slower than its peers' "
            f"median for {self.windows} windows"
        )


@dataclass(frozen=True)
class StragglerReport:
    """One window's verdict: the stragglers now, and those named in the last window that no longer are."""

    stragglers: tuple[Straggler, ...] = ()
    recovered: tuple[int, ...] = ()
    """Global ranks that were stragglers in the previous window and are not now."""

    def as_record(self) -> dict[str, Any]:
        """``{"stragglers": [...]}`` when there are any, else nothing (a metrics-file fragment)."""
        return {"stragglers": [s.as_record() for s in self.stragglers]} if self.stragglers else {}

    def log_lines(self) -> list[str]:
        """What the logging rank logs for this window: the stragglers while there are any, and recoveries."""
        lines = []
        if self.stragglers:
            named = "; ".join(s.describe() for s in self.stragglers[:MAX_NAMED_IN_LOG])
            more = len(self.stragglers) - MAX_NAMED_IN_LOG
            tail = f"; and {more} more (metrics file)" if more > 0 else ""
            lines.append(f"straggler{'s' if len(self.stragglers) > 1 else ''}: {named}{tail}")
        if self.recovered:
            lines.append("no longer stragglers: " + ", ".join(f"rank {r}" for r in self.recovered))
        return lines


@dataclass
class StragglerWatch:
    """Counts each rank's consecutive slow windows and names the ranks slow in ``windows`` of them in a row.

    One per run, owned by the training loop; :meth:`update` once per log
    window with that window's per-rank times (see :func:`slow_ranks`). A
    window without times (a rank timed nothing) is not given to it: it neither
    extends nor breaks a run of slow windows. The counts start again after a
    restart.
    """

    margin: float = DEFAULT_MARGIN
    windows: int = DEFAULT_WINDOWS
    _slow_for: dict[int, int] = field(default_factory=dict, init=False, repr=False)
    _named: frozenset[int] = field(default=frozenset(), init=False, repr=False)

    def __post_init__(self) -> None:
        if self.margin <= 0:
            raise ValueError(f"the straggler margin must be positive, not {self.margin}")
        if self.windows < 1:
            raise ValueError(f"the straggler windows must be at least 1, not {self.windows}")

    def update(
        self, compute_ms: Sequence[float], pipeline_ranks: Sequence[int], hosts: Sequence[str] = ()
    ) -> StragglerReport:
        """Add one window; the stragglers after it (ordered by rank) and the ranks that stopped being ones."""
        slow = slow_ranks(compute_ms, pipeline_ranks, margin=self.margin)
        self._slow_for = {rank: self._slow_for.get(rank, 0) + 1 for rank in slow}
        stragglers = tuple(
            Straggler(
                rank=rank,
                pipeline_rank=pipeline_ranks[rank],
                slower=slow[rank],
                windows=count,
                host=hosts[rank] if rank < len(hosts) else "",
            )
            for rank, count in sorted(self._slow_for.items())
            if count >= self.windows
        )
        named = frozenset(s.rank for s in stragglers)
        recovered = tuple(sorted(self._named - named))
        self._named = named
        return StragglerReport(stragglers=stragglers, recovered=recovered)

    def slow_for(self, rank: int) -> int:
        """Consecutive slow windows of ``rank`` so far (0: not slow in the latest window)."""
        return self._slow_for.get(rank, 0)
