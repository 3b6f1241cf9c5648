"""Where a training step's time goes, from Megatron-Core's own timers.

``--timing-log-level 1`` times the step: ``forward-backward`` (the whole
schedule, data-parallel gradient sync included), ``all-grads-sync`` and
``optimizer``. Level 2 adds Megatron-Core's per-microbatch timers: every
``forward-compute`` and ``backward-compute`` and every pipeline send/receive
wait (``forward-recv``, ``backward-send-forward-recv``, …).

From the level-2 timers of every rank this module measures the pipeline
bubble. On one rank, over a step::

    pipeline  = forward-backward − all-grads-sync   # the schedule itself
    compute   = forward-compute + backward-compute
    idle      = pipeline − compute                  # waiting: bubble and p2p

    measured bubble = idle / compute

which is the quantity the 1F1B analysis predicts as ``(p − 1) / (v · m)``
(Narayanan et al. 2021, §2.2: the bubble relative to the ideal compute time,
p stages, v model chunks per stage, m microbatches). Its share of the step is
``idle / pipeline``. The measurement also counts point-to-point transfer time
and any imbalance between stages as idle, so it is an upper bound of the
schedule's own bubble; the difference is the communication that did not
overlap.

``p2p-wait`` sums Megatron-Core's send/receive timers. They time the blocking
calls only: with the interleaved schedule's overlapped communication (our
default for VP > 1) the calls just post the transfers, and the waits for
them happen later, untimed, inside the schedule; they show up as idle time
in the bubble, not in ``p2p-wait``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# torch is imported where a run collects its timers, not with the timers' names: the benchmarks that read a
# run's metrics (bench/train_throughput.py, the GPU check's steps) start without it.

STEP_TIMERS = ("forward-backward", "all-grads-sync", "optimizer")
"""Level 1: the parts of one optimizer step."""
COMPUTE_TIMERS = ("forward-compute", "backward-compute")
"""Level 2: model computation of every microbatch (the loss included)."""
P2P_TIMERS = (
    "forward-recv",
    "forward-send",
    "backward-recv",
    "backward-send",
    "forward-send-backward-recv",
    "backward-send-forward-recv",
    "forward-send-forward-recv",
    "backward-send-backward-recv",
    "forward-backward-send-forward-backward-recv",
)
"""Level 2: pipeline point-to-point calls that block (Megatron-Core's names)."""


def timer_names(level: int) -> tuple[str, ...]:
    """The timers that exist at a ``--timing-log-level``."""
    if level <= 0:
        return ()
    return STEP_TIMERS + (COMPUTE_TIMERS + P2P_TIMERS if level >= 2 else ())


def _level_of(name: str) -> int:
    return 1 if name in STEP_TIMERS else 2


@dataclass(frozen=True)
class BubbleReport:
    """Measured against predicted pipeline bubble (see the module docstring)."""

    predicted: float
    """``(p − 1) / (v · m)``: bubble time relative to ideal compute time."""
    per_rank: tuple[float, ...]
    """Measured ``idle / compute`` of every rank, in rank order."""
    idle_share_per_rank: tuple[float, ...]
    """Measured ``idle / pipeline``: the share of the schedule each rank waited."""
    compute_s: tuple[float, ...]
    """Compute seconds of every rank over the measured steps."""
    pipeline_s: tuple[float, ...]
    """Schedule seconds (forward-backward minus gradient sync) of every rank."""

    @property
    def mean(self) -> float:
        return sum(self.per_rank) / len(self.per_rank)

    @property
    def predicted_share(self) -> float:
        """The prediction as a share of the schedule: b / (1 + b)."""
        return self.predicted / (1.0 + self.predicted)

    def as_record(self) -> dict[str, Any]:
        return {
            "bubble_predicted": self.predicted,
            "bubble_measured_mean": self.mean,
            "bubble_measured_per_rank": list(self.per_rank),
            "bubble_idle_share_per_rank": list(self.idle_share_per_rank),
            "bubble_predicted_share": self.predicted_share,
            "bubble_compute_s": list(self.compute_s),
            "bubble_pipeline_s": list(self.pipeline_s),
        }

    def describe(self) -> str:
        ranks = ", ".join(f"{b:.3f}" for b in self.per_rank)
        return (
            f"pipeline bubble: measured {self.mean:.3f} (mean over ranks of idle/compute; per rank {ranks}) vs "
            f"(p-1)/(v*m) = {self.predicted:.3f}; idle share of the schedule measured "
            f"{sum(self.idle_share_per_rank) / len(self.idle_share_per_rank):.1%} vs {self.predicted_share:.1%}"
        )


def measure_bubble(per_rank: Sequence[dict[str, float]], *, predicted: float) -> BubbleReport | None:
    """Bubble from every rank's accumulated level-2 timer seconds (None without them)."""
    compute, pipeline = [], []
    for times in per_rank:
        c = sum(times.get(name, 0.0) for name in COMPUTE_TIMERS)
        p = times.get("forward-backward", 0.0) - times.get("all-grads-sync", 0.0)
        if c <= 0.0 or p <= 0.0:
            return None
        compute.append(c)
        # Timer resolution can put compute a hair above the schedule on a rank
        # that never waits; that rank's idle time is zero, not negative.
        pipeline.append(max(p, c))
    return BubbleReport(
        predicted=predicted,
        per_rank=tuple((p - c) / c for p, c in zip(pipeline, compute, strict=True)),
        idle_share_per_rank=tuple((p - c) / p for p, c in zip(pipeline, compute, strict=True)),
        compute_s=tuple(compute),
        pipeline_s=tuple(pipeline),
    )


@dataclass
class StepTimers:
    """Megatron-Core ``Timers`` for a run, read out on every rank at log intervals.

    ``collect()`` is a collective: every rank calls it at the same point.
    """

    level: int
    device: torch.device
    timers: Any = field(init=False)
    totals: list[dict[str, float]] = field(init=False, default_factory=list)
    """Per-rank seconds accumulated over the whole run (for the final bubble)."""

    def __post_init__(self) -> None:
        from megatron.core.timers import Timers

        # At level 0 every timer is Megatron-Core's no-op dummy.
        self.timers = Timers(self.level, "minmax")

    def __call__(self, name: str, log_level: int | None = None) -> Any:
        """Megatron-Core's ``timers(name, log_level)``: a real or a dummy timer."""
        return self.timers(name, log_level)

    def collect(self) -> list[dict[str, float]]:
        """Seconds per timer since the last call, for every rank (reset afterwards)."""
        import torch
        import torch.distributed as dist

        names = timer_names(self.level)
        if not names:
            return []
        # A timer that never ran is created here and reads 0.
        mine = torch.tensor(
            [self.timers(n, _level_of(n)).elapsed(reset=True) for n in names], dtype=torch.float64, device=self.device
        )
        gathered = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, mine)
        per_rank = [dict(zip(names, row.tolist(), strict=True)) for row in gathered]
        if not self.totals:
            self.totals = [dict.fromkeys(names, 0.0) for _ in per_rank]
        for total, times in zip(self.totals, per_rank, strict=True):
            for name, seconds in times.items():
                total[name] += seconds
        return per_rank


def breakdown_ms(per_rank: Sequence[dict[str, float]], *, iterations: int) -> dict[str, float]:
    """Per-iteration milliseconds of each timer, the maximum over ranks (Megatron-LM's 'max')."""
    if not per_rank or iterations <= 0:
        return {}
    out: dict[str, float] = {}
    for name in per_rank[0]:
        worst = max(times[name] for times in per_rank)
        if worst > 0.0:
            out[name] = worst * 1000.0 / iterations
    p2p = max(sum(times.get(n, 0.0) for n in P2P_TIMERS) for times in per_rank)
    if p2p > 0.0:
        out["p2p-wait"] = p2p * 1000.0 / iterations
    return out


def format_times(times_ms: dict[str, float]) -> str:
    """``name 12.3, name 4.5``: a breakdown for the log line."""
    return ", ".join(f"{name} {ms:.1f}" for name, ms in times_ms.items())
