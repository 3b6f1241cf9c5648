"""The order in which Megatron-Core's pipeline schedules run forward and backward passes, and its timeline.

The warm-up count and the bubble formula live in ``megatron_ext.parallel.pipeline``.

Derived from ``megatron/core/pipeline_parallel/schedules.py`` (Megatron-Core
0.16) and checked against a recorded CPU run of it
(``tests/estimate/test_pipeline_schedule.py``). For ``p`` pipeline ranks, ``v`` model
chunks per rank and ``m`` microbatches:

* **1F1B** (``v = 1``): rank ``r`` runs ``w = min(m, p − r − 1)`` warm-up
  forward passes, then ``m − w`` times "forward ``w + i``, backward ``i``",
  then the ``w`` remaining backward passes.
* **Interleaved 1F1B** (``v > 1``): the microbatches are taken in groups of
  ``n`` (``microbatch_group_size_per_vp_stage``, ``p`` by default; a last
  group smaller than ``p`` is refused);
  the *schedule table* lists, group by group, every chunk ``0 … v−1`` for the
  group's microbatches. Forward pass ``k`` runs table entry ``k``; backward
  pass ``k`` runs the same microbatch on the mirrored chunk ``v − 1 − c``.
  Rank ``r`` runs ``w = min(m·v, 2·(p − r − 1) + (v − 1)·n)`` warm-up forward
  passes, then "forward ``w + i``, backward ``i``", then the rest of the
  backward passes (``get_pp_rank_microbatches``, ``get_schedule_table``).

Chunk ``c`` of rank ``r`` holds virtual stage ``c·p + r``: a forward pass
needs the same chunk's output from rank ``r − 1`` (rank 0 needs chunk
``c − 1`` from rank ``p − 1``); backward passes run the other way round.
``simulate`` places every pass at the earliest time its rank is free and its
input has arrived. With forward time ``t_f`` and backward time ``t_b`` per
microbatch and stage (``t_f/v``, ``t_b/v`` per chunk) the step takes
``(m + (p − 1)/v)·(t_f + t_b)``: the bubble is ``(p − 1)/(v·m)`` of the ideal
``m·(t_f + t_b)`` (Narayanan et al. 2021, §2.2).

**GPipe** (Huang et al. 2019), for comparison only (Megatron-Core does not
offer it): every rank runs all ``m`` forward passes, then all ``m`` backward
passes. Its bubble is 1F1B's, ``(p − 1)/m``, but a rank holds the activations
of all ``m`` microbatches at once instead of at most ``p − r``.

Point-to-point transfers: Megatron-Core's 1F1B sends and receives
synchronously, so a rank that sends is busy for the transfer
(``blocking_p2p``); the interleaved schedule overlaps them with compute
(``overlap_p2p_comm``), so a transfer only delays the pass that needs it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from megatron_ext.parallel.layout import ParallelLayout
from megatron_ext.parallel.pipeline import bubble_fraction, warmup_passes

KINDS = "FBW"
"""Pass kinds: forward, backward (with the weight gradients unless a W is split off), weight gradients
(zero-bubble schedules, ``zero_bubble.py``)."""


class PipelinePass(NamedTuple):
    """One forward or backward pass of one microbatch through one model chunk (a named tuple: a step holds
    hundreds of thousands, made and read in the simulator's inner loop)."""

    kind: str
    """``F`` (forward), ``B`` (backward) or ``W`` (weight gradients split off the backward; ``KINDS``)."""
    microbatch: int
    """Microbatch index within the step (0-based, as Megatron-Core counts)."""
    chunk: int
    """Model chunk (virtual stage index on this rank, 0-based)."""


def validate(*, pp: int, vp: int, num_microbatches: int, group_size: int | None = None) -> ParallelLayout:
    """The pipeline as a ParallelLayout (one GPU per stage): the same rules and messages as pretrain_gpt.py."""
    return ParallelLayout(
        microbatch_group_size_per_vp_stage=group_size,
        world_size=pp,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vp if vp > 1 else None,
        micro_batch_size=1,
        global_batch_size=num_microbatches,
        num_layers=pp * vp,
        num_attention_heads=1,
    )


def schedule_table(num_microbatches: int, num_chunks: int, group_size: int) -> list[tuple[int, int]]:
    """(microbatch, chunk) of every forward pass in order: groups of ``group_size`` microbatches, all chunks each."""
    table = []
    for first in range(0, num_microbatches, group_size):
        group = range(first, min(first + group_size, num_microbatches))
        if first + group_size >= num_microbatches:
            group = range(first, num_microbatches)  # the last group takes the rest
        table += [(mb, chunk) for chunk in range(num_chunks) for mb in group]
    return table


def gpipe_order(*, pp: int, num_microbatches: int, pipeline_rank: int) -> list[PipelinePass]:
    """GPipe's order on one rank: all forward passes, then all backward passes (one chunk per rank)."""
    if not 0 <= pipeline_rank < pp:
        raise ValueError(f"pipeline_rank={pipeline_rank} is outside 0..{pp - 1}")
    if num_microbatches < 1:
        raise ValueError(f"num_microbatches must be at least 1, got {num_microbatches}")
    return [PipelinePass(kind, mb, 0) for kind in "FB" for mb in range(num_microbatches)]


def peak_in_flight(order: Sequence[PipelinePass]) -> int:
    """Most passes whose activations the rank holds at once: forward done, backward not yet."""
    live = peak = 0
    for step in order:
        live += 1 if step.kind == "F" else -1
        peak = max(peak, live)
    return peak


def sends(step: PipelinePass, *, pp: int, vp: int, pipeline_rank: int) -> bool:
    """Whether the pass's output goes to another rank: all but the last virtual stage's forward and the first's
    backward (a W's output, weight gradients, stays)."""
    if pp == 1 or step.kind == "W":
        return False
    if step.kind == "F":
        return (pipeline_rank, step.chunk) != (pp - 1, vp - 1)
    return (pipeline_rank, step.chunk) != (0, 0)


def messages_sent(order: Sequence[PipelinePass], *, pp: int, vp: int, pipeline_rank: int) -> int:
    """Activations and gradients one rank sends to another rank per step."""
    return sum(sends(step, pp=pp, vp=vp, pipeline_rank=pipeline_rank) for step in order)


def schedule_order(
    *, pp: int, vp: int, num_microbatches: int, pipeline_rank: int, group_size: int | None = None
) -> list[PipelinePass]:
    """Every pass of one pipeline rank in the order Megatron-Core runs them (see the module docstring).

    ``group_size``: the interleaved schedule's microbatch group (default ``pp``).
    """
    validate(pp=pp, vp=vp, num_microbatches=num_microbatches, group_size=group_size)
    if not 0 <= pipeline_rank < pp:
        raise ValueError(f"pipeline_rank={pipeline_rank} is outside 0..{pp - 1}")
    forward, backward = _table_passes(num_microbatches, vp, group_size or pp)
    total = num_microbatches * vp
    warmup = warmup_passes(
        pp=pp, vp=vp, num_microbatches=num_microbatches, pipeline_rank=pipeline_rank, group_size=group_size
    )
    order = list(forward[:warmup])
    for k in range(total - warmup):
        order += (forward[k + warmup], backward[k])
    order += backward[total - warmup :]
    return order


@functools.lru_cache(maxsize=8)
def _table_passes(num_microbatches: int, vp: int, group: int) -> tuple[tuple[PipelinePass, ...], ...]:
    """Forward pass ``k`` runs table entry ``k``, backward pass ``k`` the same microbatch's mirrored chunk
    (``schedule_table``; every rank shares them)."""
    table = schedule_table(num_microbatches, vp, group) if vp > 1 else [(mb, 0) for mb in range(num_microbatches)]
    return (
        tuple(PipelinePass("F", mb, chunk) for mb, chunk in table),
        tuple(PipelinePass("B", mb, vp - 1 - chunk) for mb, chunk in table),
    )


class TimedPass(NamedTuple):
    """A pass placed on the timeline."""

    rank: int
    """Pipeline rank."""
    step: PipelinePass
    """What runs."""
    start: float
    """Start time."""
    end: float
    """End time."""


@dataclass(frozen=True)
class Timeline:
    """Every rank's passes with their times."""

    pp: int
    """Pipeline ranks."""
    vp: int
    """Model chunks per rank."""
    num_microbatches: int
    """Microbatches per step."""
    forward_time: float
    """Forward time of one microbatch through one whole stage (a chunk takes 1/v of it)."""
    backward_time: float
    """Backward time of one microbatch through one whole stage."""
    passes: tuple[TimedPass, ...]
    """All passes, rank by rank in execution order."""

    @property
    def makespan(self) -> float:
        return max(p.end for p in self.passes)

    @property
    def ideal(self) -> float:
        """Busy time of every rank: ``m·(t_f + t_b)``."""
        return self.num_microbatches * (self.forward_time + self.backward_time)

    @property
    def bubble_of_ideal(self) -> float:
        """Idle time relative to the ideal, measured on the timeline (formula: (p−1)/(v·m))."""
        return (self.makespan - self.ideal) / self.ideal

    @property
    def bubble_of_step(self) -> float:
        """Idle time as a share of the step."""
        return (self.makespan - self.ideal) / self.makespan

    @property
    def formula_bubble(self) -> float:
        return bubble_fraction(pp=self.pp, vp=self.vp, num_microbatches=self.num_microbatches)


def uniform_chunk_times(
    *, pp: int, vp: int, forward_time: float, backward_time: float
) -> list[list[tuple[float, float]]]:
    """Equal stages: every chunk takes ``1/v`` of a stage's forward and backward time."""
    return [[(forward_time / vp, backward_time / vp)] * vp for _ in range(pp)]


def simulate(
    *,
    pp: int,
    vp: int,
    num_microbatches: int,
    forward_time: float = 1.0,
    backward_time: float = 2.0,
    p2p_time: float = 0.0,
    orders: list[list[PipelinePass]] | None = None,
    group_size: int | None = None,
    chunk_times: Sequence[Sequence[tuple[float, ...]]] | None = None,
    blocking_p2p: bool = False,
) -> Timeline:
    """Place every pass at the earliest time its rank and input allow.

    ``blocking_p2p``: a rank that sends to another rank is busy for ``p2p_time``
    after the pass (1F1B's synchronous send); otherwise the transfer only
    delays the receiver (the interleaved schedule's overlapped send).

    ``orders`` (one list per rank) defaults to Megatron-Core's order
    (``schedule_order``); a recorded order can be given instead.
    ``chunk_times[rank][chunk]`` gives (forward, backward) of one microbatch
    through that chunk, for uneven or measured stages; by default every chunk
    takes ``forward_time / vp`` and ``backward_time / vp``. Orders with W passes
    (a zero-bubble schedule's) take (F, B, W) per chunk; a W needs only its own
    B, which its rank's order runs before it.
    """
    if forward_time <= 0 or backward_time <= 0 or p2p_time < 0:
        raise ValueError("forward and backward times must be positive and the p2p time non-negative")
    if chunk_times is not None and (len(chunk_times) != pp or any(len(row) != vp for row in chunk_times)):
        raise ValueError(f"chunk_times must give (forward, backward) for {pp} ranks × {vp} chunks")
    if orders is None:
        orders = [
            schedule_order(pp=pp, vp=vp, num_microbatches=num_microbatches, pipeline_rank=r, group_size=group_size)
            for r in range(pp)
        ]
    elif len(orders) != pp:
        raise ValueError(f"{len(orders)} rank orders given for {pp} pipeline ranks")
    times = chunk_times or uniform_chunk_times(pp=pp, vp=vp, forward_time=forward_time, backward_time=backward_time)
    if chunk_times is not None:
        # The timeline's ideal is the slowest stage's busy time: it sets the pace.
        slowest = max(times, key=lambda row: sum(map(sum, row)))
        forward_time, backward_time = sum(t[0] for t in slowest), sum(sum(t[1:]) for t in slowest)
    m = num_microbatches

    if any(step.microbatch >= m or step.chunk >= vp for order in orders for step in order):
        raise ValueError(f"an order names a microbatch or chunk outside m={m}, v={vp}")
    # Every pass has its index in ``done``, ((rank·3 + kind)·m + mb)·v + chunk, and per rank a plan of
    # (pass, own index, the index of the pass whose output it needs (``ready_now``: none), the transfer when
    # that comes from another rank, duration, what a blocking send holds the rank after it).
    kind_index = {kind: k for k, kind in enumerate(KINDS)}
    stride = m * vp  # one kind of one rank
    done: list[float | None] = [None] * (3 * pp * stride) + [0.0]
    ready_now = len(done) - 1  # the index of a pass that needs nothing: there from the start
    plans = []
    for rank, order in enumerate(orders):
        plan = []
        row = times[rank]
        for step in order:
            kind, mb, c = step
            k = kind_index[kind]
            offset = mb * vp + c
            if k == 2:  # W: its own B runs before it on the same rank, as the order sees to
                dep, remote = -1, False
            elif k == 0 and rank > 0:  # F: the same chunk's output from the previous rank
                dep, remote = (rank - 1) * 3 * stride + offset, True
            elif k == 0:  # rank 0: the previous chunk's from the last rank
                dep, remote = ((pp - 1) * 3 * stride + offset - 1, pp > 1) if c > 0 else (-1, False)
            elif rank < pp - 1:  # B: the same chunk's gradient from the next rank
                dep, remote = ((rank + 1) * 3 + 1) * stride + offset, True
            elif c < vp - 1:  # the last rank: the next chunk's from rank 0
                dep, remote = stride + offset + 1, pp > 1
            else:  # the last stage: its own forward
                dep, remote = rank * 3 * stride + offset, False
            hold = p2p_time if blocking_p2p and sends(step, pp=pp, vp=vp, pipeline_rank=rank) else 0.0
            delay = p2p_time if remote else 0.0
            plan.append(
                (step, (rank * 3 + k) * stride + offset, dep if dep >= 0 else ready_now, delay, row[c][k], hold)
            )
        plans.append(plan)
    placed: list[list[TimedPass]] = [[] for _ in range(pp)]
    free = [0.0] * pp
    position = [0] * pp
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for rank in range(pp):
            plan, at, clock = plans[rank], position[rank], free[rank]
            count, add = len(plan), placed[rank].append
            while at < count:
                step, own, dep, delay, duration, hold = plan[at]
                ready = done[dep]
                if ready is None:  # its input is not there yet
                    break
                ready += delay
                if ready > clock:
                    clock = ready
                end = clock + duration
                done[own] = end
                add(TimedPass(rank, step, clock, end))
                clock = end + hold
                at += 1
            if at > position[rank]:
                remaining -= at - position[rank]
                position[rank], free[rank] = at, clock
                progressed = True
        if not progressed:  # cannot happen for Megatron-Core's order; guards against a broken order
            raise RuntimeError("the pipeline order deadlocks: a pass waits for one that never runs")
    return Timeline(
        pp=pp,
        vp=vp,
        num_microbatches=num_microbatches,
        forward_time=forward_time,
        backward_time=backward_time,
        passes=tuple(p for rank in placed for p in rank),
    )


@dataclass(frozen=True)
class StepFigures:
    """What a comparison reads off one simulated step."""

    makespan: float
    """The step's length."""
    in_flight: tuple[int, ...]
    """Per rank, the most (microbatch, chunk) passes whose activations it holds at once."""
    messages: tuple[int, ...]
    """Per rank, the activations and gradients it sends to another rank."""


STEADY_TOLERANCE = 1e-9
"""Relative difference (of the step) below which two passes' shifts count as equal."""


def figures_at_scale(
    place: Callable[[int], tuple[StepFigures, Sequence[TimedPass]]],
    *,
    num_microbatches: int,
    pp: int,
    vp: int = 1,
    group_size: int | None = None,
) -> StepFigures:
    """The figures of ``place(num_microbatches)`` (a step placed: its figures and its passes), read off a shorter
    step when the step is long and that shorter step has reached its steady state.

    A fixed order repeats every ``period`` microbatches past its warm-up (1 without interleaving, the microbatch
    group with it), and its passes' times follow from the times before them by the same max-plus recurrence
    in every repetition. Once every pass of a window of repetitions ends exactly ``λ`` after the same pass one
    repetition earlier, each later repetition does too, up to the cool-down, which is then the shorter step's
    shifted. So the step of ``m`` microbatches is the step of ``n ≡ m`` (modulo the period, so that the last
    group is alike) plus ``(m − n)/period`` times ``λ``; the peaks are the shorter step's (reached in the
    warm-up) and the messages grow with ``m``. With rank 0's warm-up of ``w`` microbatches (``p − 1``, or
    ``(2(p − 1) + (v − 1)·N)/v`` interleaved), ``n`` starts at three spans of ``w + period + 1`` microbatches
    and two periods (warm-up and transient, the window, the cool-down) and doubles until the window repeats
    (a pipeline whose stages are nearly even can take long to settle) or the step is simulated whole.
    ``tests/estimate/test_long_steps.py`` checks this against whole steps.
    """
    m = num_microbatches
    period = (group_size or pp) if vp > 1 else 1
    # How far apart (in microbatches) the passes that wait on each other are: rank 0's warm-up, unclamped
    # (past it no rank's warm-up depends on m), and a group, over which the table spreads a microbatch's chunks.
    warmup = warmup_passes(pp=pp, vp=vp, num_microbatches=pp * vp * period, pipeline_rank=0, group_size=group_size)
    span = -(-warmup // vp) + period + 1
    n = 3 * span + 2 * period
    while n + (m - n) % period < m:
        n += (m - n) % period
        figures, passes = place(n)
        shift = _steady_shift(passes, microbatches=n, period=period, span=span, step=figures.makespan)
        if shift is not None:
            return StepFigures(
                makespan=figures.makespan + (m - n) // period * shift,
                in_flight=figures.in_flight,  # reached in the warm-up
                messages=tuple(k * m // n for k in figures.messages),  # each rank sends per microbatch
            )
        n *= 2
    return place(m)[0]


def _steady_shift(
    passes: Sequence[TimedPass], *, microbatches: int, period: int, span: int, step: float
) -> float | None:
    """The time every pass of the microbatches ``[n − period − 2·span, n − period − span)`` ends after the same
    pass ``period`` microbatches earlier, when it is one time for all of them (else None)."""
    high = microbatches - period - span
    low = high - span
    if low < span:
        return None
    end = {(p.rank, *p.step): p.end for p in passes if low <= p.step.microbatch < high + period}
    shifts = [
        end[(rank, kind, mb + period, chunk)] - when for (rank, kind, mb, chunk), when in end.items() if mb < high
    ]
    if not shifts or any(abs(s - shifts[0]) > STEADY_TOLERANCE * step for s in shifts):
        return None
    return shifts[0]
