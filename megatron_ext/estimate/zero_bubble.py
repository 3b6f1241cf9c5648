"""Zero-bubble pipeline schedules, simulated pass by pass: the backward pass split into B and W.

Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024) split each backward pass in two: **B**, the gradient
with respect to the stage's input, which the previous stage waits for, and **W**, the gradient with respect to
its weights, which nothing downstream waits for. W passes can then fill the idle slots of warm-up and cool-down.
The activations of a microbatch are held from its forward pass until its W has run (W needs the layer inputs).

This module places F, B and W passes of three schedules, each within an activation-memory limit (in a whole
stage's microbatch activations; 1F1B holds ``p − r`` on rank ``r``, ``p`` at most):

* **ZB-H1** (``zb_h1_order``): 1F1B's F and B order, each B followed by its W, rank ``r`` keeping ``r`` W passes
  back for its cool-down. Its idle time per rank is the paper's ``(p − 1)·(t_F + t_B − t_W)`` against 1F1B's
  ``(p − 1)·(t_F + t_B + t_W)`` (``parallel.pipeline.zb_h1_bubble``): a third of it when the three passes take equal time, at
  1F1B's peak memory.
* **ZB-V**: two chunks per rank placed in a V: rank ``r`` holds stages ``r`` and ``2p − 1 − r``, so the first and
  the last stage are both on rank 0, and a microbatch goes down the ranks and back up; at 1F1B's memory.
* **ZB interleaved**: Megatron-Core's interleaved placement (rank ``r`` holds stages ``c·p + r``) and order with
  the split backward, at interleaved 1F1B's memory: the alternative ZB-V is weighed against (issue 31, item 3).

ZB-V and ZB interleaved take the best of several orders (``simulate_zero_bubble``): greedy ones, chosen as the
simulation runs as the paper's heuristic does (a free rank runs a B whose gradient has arrived, the critical
path; else, past a number of pending W passes, a W; else an F whose input has arrived if the memory allows;
else a W; else it waits), and for ZB interleaved Megatron-Core's order split (``split_order``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from megatron_ext.estimate.pipeline_schedule import (
    STEADY_TOLERANCE,
    PipelinePass,
    Rows,
    Step,
    StepFigures,
    TimedPass,
    as_passes,
    figures_at_scale,
    peak_held,
    place,
    place_all,
    schedule_rows,
)
from megatron_ext.parallel.pipeline import warmup_passes

SCHEDULES = ("zb-h1", "zb-v", "zb-interleaved")
"""The zero-bubble schedules this simulator places."""


@dataclass(frozen=True)
class Placement:
    """Which pipeline stage each (rank, chunk) holds."""

    pp: int
    vp: int
    v_shape: bool
    """ZB-V's placement (``vp = 2``: rank ``r`` holds stages ``r`` and ``2p − 1 − r``); else interleaved."""

    def stage(self, rank: int, chunk: int) -> int:
        if self.v_shape:
            return rank if chunk == 0 else 2 * self.pp - 1 - rank
        return chunk * self.pp + rank

    def holder(self, stage: int) -> tuple[int, int]:
        """(rank, chunk) holding ``stage``."""
        if self.v_shape:
            return (stage, 0) if stage < self.pp else (2 * self.pp - 1 - stage, 1)
        return stage % self.pp, stage // self.pp

    @property
    def stages(self) -> int:
        return self.pp * self.vp

    def sends(self, rank: int, step: PipelinePass) -> bool:
        """Whether the pass's output goes to another rank (a W's never leaves it)."""
        stage = self.stage(rank, step.chunk)
        if step.kind == "F" and stage < self.stages - 1:
            return self.holder(stage + 1)[0] != rank
        if step.kind == "B" and stage > 0:
            return self.holder(stage - 1)[0] != rank
        return False


@dataclass(frozen=True)
class ZeroBubbleTimeline:
    """A zero-bubble step: every rank's F, B and W passes with their times, and what each rank held."""

    schedule: str
    pp: int
    vp: int
    num_microbatches: int
    passes: tuple[TimedPass, ...]
    ideal: float
    """Every rank's busy time: ``m·(t_F + t_B + t_W)`` of a whole stage."""
    peak_activations: tuple[float, ...]
    """Per rank, the most stage activations held at once (a chunk's microbatch is ``1/v`` of one)."""
    peak_w_store: tuple[float, ...]
    """Per rank, the most stage activations held only for a W pass still to run (B done, W not)."""

    @property
    def makespan(self) -> float:
        return max(p.end for p in self.passes)

    @property
    def bubble_of_ideal(self) -> float:
        return (self.makespan - self.ideal) / self.ideal


def split_rows(rows: Rows, *, defer: int) -> Rows:
    """An unsplit schedule's order with each B followed by a W, except that the rank keeps ``defer`` W passes
    back and runs them last: the F and B passes keep their order, and the deferred W passes fill the cool-down."""
    backward = rows[:, 0] == 1
    count = int(backward.sum())
    kept = min(defer, count)
    # Each pass moves later by the W passes placed before it: one after each B but the first ``defer``.
    before = np.cumsum(backward) - backward
    at = np.arange(len(rows)) + np.maximum(before - defer, 0)
    out = np.empty((len(rows) + count, 3), dtype=np.int64)
    out[at] = rows
    weights = rows[backward].copy()
    weights[:, 0] = 2
    b_at = at[backward]
    out[b_at[defer:] + 1] = weights[: count - kept]  # the W of the B ``defer`` before
    out[len(out) - kept :] = weights[count - kept :]
    return out


def zb_h1_rows(*, pp: int, num_microbatches: int, pipeline_rank: int) -> Rows:
    """ZB-H1's order on one rank (Qi et al. 2024, §3.1): 1F1B's F and B passes
    (``pipeline_schedule.schedule_rows``), each B followed by a W, rank ``r`` keeping ``r`` W passes back for its
    cool-down, where it waits for the last B passes to travel from the last rank to rank 0."""
    rows = schedule_rows(pp=pp, vp=1, num_microbatches=num_microbatches, pipeline_rank=pipeline_rank)
    return split_rows(rows, defer=pipeline_rank)


def zb_h1_order(*, pp: int, num_microbatches: int, pipeline_rank: int) -> list[PipelinePass]:
    return as_passes(zb_h1_rows(pp=pp, num_microbatches=num_microbatches, pipeline_rank=pipeline_rank))


def memory_limits(schedule: str, *, pp: int, vp: int, num_microbatches: int) -> list[float]:
    """Each rank's activation limit, in stage activations: the peak of the schedule it is compared with, on
    every rank (a schedule's memory is its most loaded rank's). 1F1B's rank 0 holds ``min(p, m)`` (``zb-h1``,
    ``zb-v``); interleaved 1F1B's rank 0 its ``w + 1`` chunk passes of ``1/v`` each (``zb-interleaved``,
    ``parallel.pipeline.warmup_passes``)."""
    if schedule == "zb-interleaved":
        peak = (warmup_passes(pp=pp, vp=vp, num_microbatches=num_microbatches, pipeline_rank=0) + 1) / vp
    else:
        peak = float(min(pp, num_microbatches))
    return [peak] * pp


def simulate_zero_bubble(
    schedule: str,
    *,
    pp: int,
    num_microbatches: int,
    vp: int = 2,
    forward_time: float = 1.0,
    backward_time: float = 1.0,
    weight_time: float = 1.0,
    p2p_time: float = 0.0,
    chunk_times: Sequence[Sequence[tuple[float, float, float]]] | None = None,
) -> ZeroBubbleTimeline:
    """Place one step of ``schedule`` (``SCHEDULES``); times are a whole stage's F, B and W for one microbatch
    (a chunk takes ``1/v`` of them), or ``chunk_times[rank][chunk]`` = (F, B, W) per chunk.

    ZB-H1 runs its handcrafted order (``zb_h1_order``). The others take, of their candidates, the one that
    finishes first within the memory limit: ZB interleaved Megatron-Core's interleaved order split
    (``split_order``), rank ``r`` keeping none, half or all of the ``w_0 − w_r`` W passes back that rank 0's
    larger warm-up leaves it room for (ZB-H1 keeps ``r``: the same rule on 1F1B); ZB-V the greedy choice
    (module docstring) with W passes run before F passes once more than 0, 1, 2, ``p`` or any are pending.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown zero-bubble schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    if schedule == "zb-h1":
        vp = 1
    if schedule == "zb-v" and vp != 2:
        raise ValueError("ZB-V places exactly two chunks per rank (vp = 2)")
    if pp < 2 or num_microbatches < 1 or vp < 1:
        raise ValueError("a zero-bubble schedule needs pp >= 2, at least one microbatch and vp >= 1")
    if min(forward_time, backward_time, weight_time) <= 0 or p2p_time < 0:
        raise ValueError("pass times must be positive and the p2p time non-negative")
    m = num_microbatches
    times = chunk_times or [[(forward_time / vp, backward_time / vp, weight_time / vp)] * vp for _ in range(pp)]
    place = functools.partial(_place, schedule, pp=pp, vp=vp, m=m, times=times, p2p_time=p2p_time)
    if schedule == "zb-v":
        candidates = [place(w_first_above=k) for k in (0, 1, 2, pp, m * vp)]
    else:
        candidates = [place(orders=o) for o in fixed_orders(schedule, pp=pp, vp=vp, num_microbatches=m)]
    return candidates[_first_within(schedule, candidates, pp=pp, vp=vp, num_microbatches=m)]  # type: ignore[return-value]


def zero_bubble_at_scale(
    schedule: str,
    *,
    pp: int,
    num_microbatches: int,
    vp: int,
    chunk_times: Sequence[Sequence[tuple[float, float, float]]],
    p2p_times: Sequence[float],
) -> tuple[list[StepFigures], int]:
    """``simulate_zero_bubble``'s step of ZB-H1 or ZB interleaved as figures, at each transfer time of
    ``p2p_times``, and which of its candidate orders (``fixed_orders``) it is: every candidate's step at every
    transfer time placed together and read off shorter steps when it is long
    (``pipeline_schedule.figures_at_scale``); the candidate is the one that finishes first within the memory
    limit at the first transfer time (the others: the same order, e.g. with free transfers)."""
    if schedule not in ("zb-h1", "zb-interleaved"):
        raise ValueError(f"{schedule} is not placed in fixed orders: simulate_zero_bubble places it")
    times = len(p2p_times)

    def place_steps(n: int, which: Sequence[int]) -> list[tuple[StepFigures, np.ndarray]]:
        candidates = fixed_orders(schedule, pp=pp, vp=vp, num_microbatches=n)
        steps = [Step(candidates[k // times], chunk_times, p2p_times[k % times]) for k in which]
        messages = _messages(schedule, pp=pp, vp=vp, num_microbatches=n)
        held = {k // times: tuple(peak_held(rows, released_by=2) for rows in candidates[k // times]) for k in which}
        placed = place_all(steps, pp=pp, vp=vp, num_microbatches=n, starts=False)
        return [
            (StepFigures(makespan=step.makespan, in_flight=held[k // times], messages=messages), step.end)
            for k, step in zip(which, placed, strict=True)
        ]

    count = 1 if schedule == "zb-h1" else len(INTERLEAVED_SHARES)
    found = figures_at_scale(place_steps, variants=count * times, num_microbatches=num_microbatches, pp=pp, vp=vp)
    candidates = found[::times]  # at the first transfer time
    limits = memory_limits(schedule, pp=pp, vp=vp, num_microbatches=num_microbatches)
    fitting = [
        k for k, c in enumerate(candidates) if all(n / vp <= b + 1e-9 for n, b in zip(c.in_flight, limits, strict=True))
    ]
    if not fitting:
        raise RuntimeError(f"no {schedule} order of p={pp}, m={num_microbatches} keeps within the memory limit")
    chosen = fitting[_fastest([candidates[k].makespan for k in fitting])]
    return found[chosen * times : (chosen + 1) * times], chosen


def zero_bubble_figures(timeline: ZeroBubbleTimeline) -> StepFigures:
    """A zero-bubble step's length, the chunk activations each rank holds at most, and the messages it sends."""
    return StepFigures(
        makespan=timeline.makespan,
        in_flight=tuple(round(peak * timeline.vp) for peak in timeline.peak_activations),
        messages=_messages(
            timeline.schedule, pp=timeline.pp, vp=timeline.vp, num_microbatches=timeline.num_microbatches
        ),
    )


def _messages(schedule: str, *, pp: int, vp: int, num_microbatches: int) -> tuple[int, ...]:
    """Per rank, the activations and gradients it sends in a step: every rank runs each (kind, chunk) once per
    microbatch."""
    placement = Placement(pp, vp, v_shape=schedule == "zb-v")
    return tuple(
        num_microbatches
        * sum(placement.sends(rank, PipelinePass(kind, 0, chunk)) for kind in "FB" for chunk in range(vp))
        for rank in range(pp)
    )


def _first_within(
    schedule: str, candidates: Sequence[ZeroBubbleTimeline | None], *, pp: int, vp: int, num_microbatches: int
) -> int:
    """The index of the candidate that finishes first within the schedule's memory limit."""
    limits = memory_limits(schedule, pp=pp, vp=vp, num_microbatches=num_microbatches)
    fitting = [
        i
        for i, t in enumerate(candidates)
        if t is not None and all(a <= b + 1e-9 for a, b in zip(t.peak_activations, limits, strict=True))
    ]
    if not fitting:
        raise RuntimeError(f"no {schedule} order of p={pp}, m={num_microbatches} keeps within the memory limit")
    return fitting[_fastest([candidates[i].makespan for i in fitting])]  # type: ignore[union-attr]


def _fastest(makespans: Sequence[float]) -> int:
    """The index of the shortest step; an earlier one within ``STEADY_TOLERANCE`` of it wins (fewer W passes kept
    back), so that rounding never decides between equal steps."""
    shortest = min(makespans)
    return next(i for i, t in enumerate(makespans) if t <= shortest * (1 + STEADY_TOLERANCE))


INTERLEAVED_SHARES = (0.0, 0.5, 1.0)
"""ZB interleaved's candidates: the shares of ``w_0 − w_r`` W passes that rank ``r`` keeps back."""


def interleaved_defers(*, pp: int, vp: int, num_microbatches: int, share: float) -> list[int]:
    """The W passes each rank keeps back for its cool-down in ZB interleaved: ``share`` of the ``w_0 − w_r``
    chunk activations that rank 0's larger warm-up leaves rank ``r`` room for."""
    warmups = [warmup_passes(pp=pp, vp=vp, num_microbatches=num_microbatches, pipeline_rank=r) for r in range(pp)]
    return [int((warmups[0] - w) * share) for w in warmups]


def _interleaved_orders(*, pp: int, vp: int, num_microbatches: int) -> tuple[list[list[int]], list[list[Rows]]]:
    """ZB interleaved's candidates (the W passes each rank keeps back, and every rank's order): rank ``r`` may
    hold what rank 0 holds, ``w_0 − w_r`` chunks more than its own interleaved peak, so it keeps that many W
    passes back (ZB-H1's ``r``, generalised), or half as many, or none."""
    m = num_microbatches
    defers = [interleaved_defers(pp=pp, vp=vp, num_microbatches=m, share=share) for share in INTERLEAVED_SHARES]
    unsplit = [schedule_rows(pp=pp, vp=vp, num_microbatches=m, pipeline_rank=r) for r in range(pp)]
    orders = [[split_rows(rows, defer=d) for rows, d in zip(unsplit, ds, strict=True)] for ds in defers]
    return defers, orders


def fixed_orders(schedule: str, *, pp: int, vp: int, num_microbatches: int) -> list[list[Rows]]:
    """The fixed orders ZB-H1 (one: ``zb_h1_order``) and ZB interleaved (``_interleaved_orders``) choose from,
    each with every rank's order."""
    if schedule == "zb-h1":
        return [[zb_h1_rows(pp=pp, num_microbatches=num_microbatches, pipeline_rank=r) for r in range(pp)]]
    return _interleaved_orders(pp=pp, vp=vp, num_microbatches=num_microbatches)[1]


@functools.lru_cache(maxsize=32)
def zb_interleaved_defers(*, pp: int, vp: int, num_microbatches: int) -> tuple[int, ...]:
    """What ``--enable-zero-bubble`` with virtual stages keeps back per rank (``training.zero_bubble_schedule``):
    the candidate that simulation with equal chunk F, B and W times finishes first within interleaved 1F1B's
    memory."""
    m = num_microbatches
    times = [[(1.0, 1.0, 1.0)] * vp] * pp
    place = functools.partial(_place_in_order, "zb-interleaved", pp=pp, vp=vp, m=m, times=times, p2p_time=0.0)
    defers, orders = _interleaved_orders(pp=pp, vp=vp, num_microbatches=m)
    candidates = [place(orders=o) for o in orders]
    return tuple(defers[_first_within("zb-interleaved", candidates, pp=pp, vp=vp, num_microbatches=m)])


def _place(
    schedule: str,
    *,
    pp: int,
    vp: int,
    m: int,
    times: Sequence[Sequence[tuple[float, float, float]]],
    p2p_time: float,
    orders: list[Rows] | None = None,
    w_first_above: int = 0,
) -> ZeroBubbleTimeline | None:
    """One step placed pass by pass: the ranks' fixed ``orders`` (``_place_in_order``), or the greedy choice;
    None if it deadlocks (a fixed order whose memory the limit would not allow is still placed: the caller
    checks the peak).

    Greedy: the rank that is free first goes next: it takes back the activations its finished W passes
    released, chooses a pass whose input has arrived (the greedy choice of the module docstring), and runs it;
    with none to run, it waits for the next event that could give it one.
    """
    if orders is not None:
        return _place_in_order(schedule, pp=pp, vp=vp, m=m, times=times, p2p_time=p2p_time, orders=orders)
    step = _StepState(schedule, pp=pp, vp=vp, m=m, times=times, p2p_time=p2p_time)
    while not step.complete:
        rank = min(range(pp), key=lambda r: step.free[r])
        now = step.free[rank]
        step.release(rank, now)
        chosen, later = step.greedy_choice(rank, now, w_first_above=w_first_above)
        if chosen is None:
            if not step.wait(rank, now, later):
                return None  # every rank waits for a pass that no rank can run: the order deadlocks
            continue
        step.run(rank, now, chosen)
    return step.timeline()


def _place_in_order(
    schedule: str,
    *,
    pp: int,
    vp: int,
    m: int,
    times: Sequence[Sequence[tuple[float, float, float]]],
    p2p_time: float,
    orders: list[Rows],
) -> ZeroBubbleTimeline | None:
    """Fixed orders: every pass at the earliest time its rank is free and its input has arrived, the transfers
    delaying only the pass that needs them (``pipeline_schedule.place``, the interleaved placement). What a
    rank holds follows from its order alone: a chunk's microbatch from its F until its W has run, and only for
    its W from its B."""
    try:
        placed = place(orders, pp=pp, vp=vp, num_microbatches=m, chunk_times=times, p2p_time=p2p_time)
    except RuntimeError:  # a pass waits for one that never runs
        return None
    return ZeroBubbleTimeline(
        schedule=schedule,
        pp=pp,
        vp=vp,
        num_microbatches=m,
        passes=placed.passes(),  # rank by rank in the order run: by (rank, start)
        ideal=max(m * sum(map(sum, row)) for row in times),
        peak_activations=tuple(peak_held(rows, released_by=2) / vp for rows in orders),
        peak_w_store=tuple(peak_held(rows, held_from=1, released_by=2) / vp for rows in orders),
    )


class _StepState:
    """One step while ``_place`` places it: what each rank has run, holds and waits for.

    Memory is counted in stage activations: a chunk's microbatch holds ``1/v`` of one from its F until its
    W has run (``held``), and the part held only for a W still to run (its B done) is the ``store``.
    """

    def __init__(
        self,
        schedule: str,
        *,
        pp: int,
        vp: int,
        m: int,
        times: Sequence[Sequence[tuple[float, float, float]]],
        p2p_time: float,
    ) -> None:
        self.schedule, self.pp, self.vp, self.m = schedule, pp, vp, m
        self.times, self.p2p_time = times, p2p_time
        self.placement = Placement(pp, vp, v_shape=schedule == "zb-v")
        self.limits = memory_limits(schedule, pp=pp, vp=vp, num_microbatches=m)
        self.done: dict[tuple[str, int, int], float] = {}  # (kind, microbatch, stage) -> end time
        self.free = [0.0] * pp
        self.held = [0.0] * pp
        self.store = [0.0] * pp
        self.peak, self.peak_store = [0.0] * pp, [0.0] * pp
        self.next_forward = [[0] * vp for _ in range(pp)]  # the next microbatch of each chunk to go forward
        self.pending_b: list[set[tuple[int, int]]] = [set() for _ in range(pp)]
        self.pending_w: list[list[tuple[int, int]]] = [[] for _ in range(pp)]
        self.releases: list[list[tuple[float, float]]] = [[] for _ in range(pp)]  # (time, activations a W frees)
        self.placed: list[TimedPass] = []
        self.last = self.placement.stages - 1
        self.total = 3 * m * self.placement.stages
        # A rank with nothing to run waits for its own next event (an input whose producer has run, a W's
        # release), or for a rank that may still place a pass. Ranks that wait are told apart from those that
        # act, so that two waiting ranks never step each other forward by tiny amounts (a chunk of no layers
        # runs in no time).
        self.waiting = [False] * pp
        self.own_next = [math.inf] * pp  # a waiting rank's own next event; inf: none until another rank places

    @property
    def complete(self) -> bool:
        return len(self.done) == self.total

    def arrival(self, kind: str, mb: int, stage: int) -> float | None:
        """When the input of ``kind`` for (mb, stage) is on its rank, or None if its producer has not run."""
        if kind == "F":
            if stage == 0:
                return 0.0
            src = ("F", mb, stage - 1)
        elif stage == self.last:
            src = ("F", mb, stage)
        else:
            src = ("B", mb, stage + 1)
        if src not in self.done:
            return None
        same_rank = self.placement.holder(src[2])[0] == self.placement.holder(stage)[0]
        return self.done[src] + (0.0 if same_rank else self.p2p_time)

    def release(self, rank: int, now: float) -> None:
        """Give ``rank`` back the activations of its W passes that have ended by ``now``."""
        for when, amount in [x for x in self.releases[rank] if x[0] <= now]:
            self.held[rank] -= amount
            self.releases[rank].remove((when, amount))

    def _candidates(self, rank: int, now: float) -> tuple[list[tuple[float, str, int, int]], float | None]:
        """Passes of ``rank`` whose input has arrived by ``now`` ((ready, kind, mb, chunk)), and the earliest
        later arrival among the rest whose producer has run."""
        ready, later = [], None
        for chunk in range(self.vp):
            stage = self.placement.stage(rank, chunk)
            for mb, c in self.pending_b[rank]:
                if c == chunk:
                    t = self.arrival("B", mb, stage)
                    if t is not None:
                        (ready.append((t, "B", mb, chunk)) if t <= now else None)
                        later = t if t > now and (later is None or t < later) else later
            mb = self.next_forward[rank][chunk]
            if mb < self.m:
                t = self.arrival("F", mb, stage)
                if t is not None:
                    (ready.append((t, "F", mb, chunk)) if t <= now else None)
                    later = t if t > now and (later is None or t < later) else later
        return ready, later

    def greedy_choice(
        self, rank: int, now: float, *, w_first_above: int
    ) -> tuple[tuple[str, int, int] | None, float | None]:
        """The paper's heuristic (module docstring): a B whose gradient has arrived; else, past
        ``w_first_above`` pending W passes, a W; else an F whose input has arrived, if the memory allows; else a
        W. Also the earliest later arrival, for a rank that must wait."""
        vp, placement = self.vp, self.placement
        ready, later = self._candidates(rank, now)
        backward = sorted((mb, -placement.stage(rank, c), c) for _, k, mb, c in ready if k == "B")
        # A microbatch that enters the rank will come back for its deeper chunks: their memory is reserved,
        # so that a deeper chunk's forward (on the way to the first B) is never the one that waits.
        by_stage = sorted(range(vp), key=lambda c: placement.stage(rank, c))
        entered = self.next_forward[rank][by_stage[0]]
        reserved = sum(entered - self.next_forward[rank][c] for c in by_stage[1:]) / vp
        forward = sorted(
            (mb, -placement.stage(rank, c), c)
            for _, k, mb, c in ready
            if k == "F"
            and self.held[rank] + reserved + (vp if c == by_stage[0] else 0) / vp <= self.limits[rank] + 1e-9
        )
        pending_w = self.pending_w[rank]
        if backward:
            return ("B", backward[0][0], backward[0][2]), later
        if len(pending_w) > w_first_above or (pending_w and not forward):
            return ("W", *pending_w.pop(0)), later
        if forward:
            return ("F", forward[0][0], forward[0][2]), later
        return None, later

    def wait(self, rank: int, now: float, later: float | None) -> bool:
        """Move ``rank``'s clock to the next event that could let it run a pass (its own next arrival or
        release, or another rank's); False when there is none: every rank waits, the order deadlocks."""
        self.waiting[rank] = True
        own = (t for t in (later, *(w for w, _ in self.releases[rank])) if t is not None)
        self.own_next[rank] = min(own, default=math.inf)
        others = (self.own_next[q] if self.waiting[q] else self.free[q] for q in range(self.pp) if q != rank)
        target = min(self.own_next[rank], *others)
        if target == math.inf:
            return False
        self.free[rank] = max(target, now + 1e-12)
        return True

    def run(self, rank: int, now: float, chosen: tuple[str, int, int]) -> None:
        """Place the pass on ``rank`` from ``now``, and count what it holds from then."""
        kind, mb, chunk = chosen
        vp = self.vp
        stage = self.placement.stage(rank, chunk)
        duration = self.times[rank][chunk]["FBW".index(kind)]
        end = now + duration
        self.done[(kind, mb, stage)] = end
        self.waiting = [False] * self.pp  # a new pass may be what a waiting rank waits for: each looks again
        self.placed.append(TimedPass(rank, PipelinePass(kind, mb, chunk), now, end))
        if kind == "F":
            self.held[rank] += 1 / vp
            self.next_forward[rank][chunk] += 1
            self.pending_b[rank].add((mb, chunk))
        elif kind == "B":
            self.pending_b[rank].discard((mb, chunk))
            self.pending_w[rank].append((mb, chunk))
            self.store[rank] += 1 / vp
        else:
            self.store[rank] -= 1 / vp
            self.releases[rank].append((end, 1 / vp))
        self.peak[rank] = max(self.peak[rank], self.held[rank])
        self.peak_store[rank] = max(self.peak_store[rank], self.store[rank])
        self.free[rank] = end

    def timeline(self) -> ZeroBubbleTimeline:
        busy = max(self.m * sum(sum(t) for t in row) for row in self.times)
        return ZeroBubbleTimeline(
            schedule=self.schedule,
            pp=self.pp,
            vp=self.vp,
            num_microbatches=self.m,
            passes=tuple(sorted(self.placed, key=lambda p: (p.rank, p.start))),
            ideal=busy,
            peak_activations=tuple(self.peak),
            peak_w_store=tuple(self.peak_store),
        )
