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
from typing import Any, NamedTuple

import numpy as np

from megatron_ext.parallel.layout import ParallelLayout
from megatron_ext.parallel.pipeline import bubble_fraction, schedule_table, warmup_passes

KINDS = "FBW"
"""Pass kinds: forward, backward (with the weight gradients unless a W is split off), weight gradients
(zero-bubble schedules, ``zero_bubble.py``); a pass's kind code is its index here."""

Rows = np.ndarray
"""A rank's order as the simulator reads it: one row per pass, (kind code, microbatch, chunk), int64. A step of a
thousand-GPU layout has millions of passes: made and placed as arrays, and as ``PipelinePass`` lists only for
reading (``as_passes``)."""


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


def as_passes(rows: Rows) -> list[PipelinePass]:
    """An order's rows as passes."""
    return [PipelinePass(KINDS[kind], mb, chunk) for kind, mb, chunk in rows.tolist()]


def as_rows(order: Sequence[PipelinePass]) -> Rows:
    """An order of passes as rows."""
    rows = np.array([(KINDS.index(p.kind), p.microbatch, p.chunk) for p in order], dtype=np.int64)
    return rows.reshape(len(order), 3)


def gpipe_rows(*, pp: int, num_microbatches: int, pipeline_rank: int) -> Rows:
    """GPipe's order on one rank: all forward passes, then all backward passes (one chunk per rank)."""
    if not 0 <= pipeline_rank < pp:
        raise ValueError(f"pipeline_rank={pipeline_rank} is outside 0..{pp - 1}")
    if num_microbatches < 1:
        raise ValueError(f"num_microbatches must be at least 1, got {num_microbatches}")
    rows = np.zeros((2 * num_microbatches, 3), dtype=np.int64)
    rows[num_microbatches:, 0] = 1
    rows[:, 1] = np.tile(np.arange(num_microbatches), 2)
    return rows


def gpipe_order(*, pp: int, num_microbatches: int, pipeline_rank: int) -> list[PipelinePass]:
    return as_passes(gpipe_rows(pp=pp, num_microbatches=num_microbatches, pipeline_rank=pipeline_rank))


def peak_held(rows: Rows, *, held_from: int = 0, released_by: int = 1) -> int:
    """Most passes whose activations a rank holds at once along its order: from the pass of kind ``held_from``
    (the forward) until the pass of kind ``released_by`` (the backward; a W when the backward is split) of the
    same microbatch and chunk."""
    kinds = rows[:, 0]
    held = np.cumsum((kinds == held_from).astype(np.int64) - (kinds == released_by))
    return int(held.max(initial=0))


def peak_in_flight(order: Sequence[PipelinePass]) -> int:
    """Most passes whose activations the rank holds at once: forward done, backward not yet."""
    return peak_held(as_rows(order))


def sending(rows: Rows, *, pp: int, vp: int, pipeline_rank: int) -> np.ndarray:
    """Per pass, whether its output goes to another rank: all but the last virtual stage's forward and the
    first's backward (a W's output, weight gradients, stays)."""
    kinds, chunks = rows[:, 0], rows[:, 2]
    if pp == 1:
        return np.zeros(len(rows), dtype=bool)
    last = (chunks == vp - 1) if pipeline_rank == pp - 1 else np.zeros(len(rows), dtype=bool)
    first = (chunks == 0) if pipeline_rank == 0 else np.zeros(len(rows), dtype=bool)
    return ((kinds == 0) & ~last) | ((kinds == 1) & ~first)


def messages_sent(order: Sequence[PipelinePass], *, pp: int, vp: int, pipeline_rank: int) -> int:
    """Activations and gradients one rank sends to another rank per step."""
    return int(sending(as_rows(order), pp=pp, vp=vp, pipeline_rank=pipeline_rank).sum())


def schedule_rows(
    *, pp: int, vp: int, num_microbatches: int, pipeline_rank: int, group_size: int | None = None
) -> Rows:
    """Every pass of one pipeline rank in the order Megatron-Core runs them (see the module docstring), as rows.

    ``group_size``: the interleaved schedule's microbatch group (default ``pp``).
    """
    validate(pp=pp, vp=vp, num_microbatches=num_microbatches, group_size=group_size)
    if not 0 <= pipeline_rank < pp:
        raise ValueError(f"pipeline_rank={pipeline_rank} is outside 0..{pp - 1}")
    forward, backward = _table_rows(num_microbatches, vp, group_size or pp)
    total = len(forward)
    warmup = warmup_passes(
        pp=pp, vp=vp, num_microbatches=num_microbatches, pipeline_rank=pipeline_rank, group_size=group_size
    )
    # The warm-up's forward passes, then "forward w + k, backward k", then the backward passes left.
    steady = total - warmup
    rows = np.empty((2 * total, 3), dtype=np.int64)
    rows[:warmup] = forward[:warmup]
    rows[warmup : warmup + 2 * steady : 2] = forward[warmup:]
    rows[warmup + 1 : warmup + 2 * steady : 2] = backward[:steady]
    rows[warmup + 2 * steady :] = backward[steady:]
    return rows


def schedule_order(
    *, pp: int, vp: int, num_microbatches: int, pipeline_rank: int, group_size: int | None = None
) -> list[PipelinePass]:
    """``schedule_rows`` as passes."""
    return as_passes(
        schedule_rows(
            pp=pp, vp=vp, num_microbatches=num_microbatches, pipeline_rank=pipeline_rank, group_size=group_size
        )
    )


@functools.lru_cache(maxsize=8)
def _table_rows(num_microbatches: int, vp: int, group: int) -> tuple[Rows, Rows]:
    """Forward pass ``k`` runs table entry ``k``, backward pass ``k`` the same microbatch's mirrored chunk
    (``schedule_table``; every rank shares them, read-only)."""
    if vp > 1:
        table = np.array(schedule_table(num_microbatches, vp, group), dtype=np.int64)
    else:
        table = np.stack([np.arange(num_microbatches), np.zeros(num_microbatches, dtype=np.int64)], axis=1)
    forward = np.concatenate([np.zeros((len(table), 1), dtype=np.int64), table], axis=1)
    backward = forward.copy()
    backward[:, 0] = 1
    backward[:, 2] = vp - 1 - table[:, 1]
    forward.setflags(write=False)
    backward.setflags(write=False)
    return forward, backward


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

    @classmethod
    def of_chunk_times(
        cls,
        passes: tuple[TimedPass, ...],
        *,
        pp: int,
        vp: int,
        num_microbatches: int,
        chunk_times: Sequence[Sequence[Sequence[float]]],
    ) -> Timeline:
        """The timeline of ``passes`` placed with ``chunk_times``: its ideal is the slowest stage's busy time, which
        sets the pace (``slowest_stage_times``)."""
        forward_time, backward_time = slowest_stage_times(chunk_times)
        return cls(pp=pp, vp=vp, num_microbatches=num_microbatches, forward_time=forward_time,
                   backward_time=backward_time, passes=passes)  # fmt: skip

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


def slowest_stage_times(chunk_times: Sequence[Sequence[Sequence[float]]]) -> tuple[float, float]:
    """(forward, backward) of one microbatch through the slowest stage (the most busy time: it sets the pace,
    a timeline's ideal); a split W counts with the backward."""
    slowest = max(chunk_times, key=lambda row: sum(map(sum, row)))
    return sum(t[0] for t in slowest), sum(sum(t[1:]) for t in slowest)


def uniform_chunk_times(
    *, pp: int, vp: int, forward_time: float, backward_time: float
) -> list[list[tuple[float, float]]]:
    """Equal stages: every chunk takes ``1/v`` of a stage's forward and backward time."""
    return [[(forward_time / vp, backward_time / vp)] * vp for _ in range(pp)]


@dataclass(frozen=True)
class Placed:
    """A step placed: every pass's start and end, indexed ``[rank, kind code, microbatch, chunk]`` (NaN where
    the step has no such pass), and the orders placed."""

    start: np.ndarray | None
    """None when only the ends were kept (``place_all``'s ``starts``)."""
    end: np.ndarray
    orders: tuple[Rows, ...]

    @property
    def makespan(self) -> float:
        return float(np.nanmax(self.end))

    def passes(self) -> tuple[TimedPass, ...]:
        """Every pass, rank by rank in the order run."""
        if self.start is None:
            raise ValueError("the step was placed without its passes' starts (place_all's starts=False)")
        out = []
        for rank, rows in enumerate(self.orders):
            key = (rank, rows[:, 0], rows[:, 1], rows[:, 2])
            for (kind, mb, chunk), start, end in zip(
                rows.tolist(), self.start[key].tolist(), self.end[key].tolist(), strict=True
            ):
                out.append(TimedPass(rank, PipelinePass(KINDS[kind], mb, chunk), start, end))
        return tuple(out)


class Step(NamedTuple):
    """One step to place (``place_all``): every rank's order, the passes' times, the transfers."""

    orders: Sequence[Rows]
    """Every rank's order."""
    chunk_times: Sequence[Sequence[Sequence[float]]]
    """``[rank][chunk]``: (forward, backward) of one microbatch, or (F, B, W) with W passes."""
    p2p_time: float = 0.0
    """One transfer between ranks."""
    blocking_p2p: bool = False
    """Whether a rank that sends is busy for the transfer (1F1B), or the transfer only delays the receiver."""


def place(
    orders: Sequence[Rows],
    *,
    pp: int,
    vp: int,
    num_microbatches: int,
    chunk_times: Sequence[Sequence[Sequence[float]]],
    p2p_time: float = 0.0,
    blocking_p2p: bool = False,
) -> Placed:
    """Place every pass at the earliest time its rank is free and its input has arrived (``simulate``, whose
    docstring says what the arguments mean; here every rank's order and ``chunk_times`` are given)."""
    step = Step(orders, chunk_times, p2p_time, blocking_p2p)
    return place_all([step], pp=pp, vp=vp, num_microbatches=num_microbatches)[0]


def place_all(steps: Sequence[Step], *, pp: int, vp: int, num_microbatches: int, starts: bool = True) -> list[Placed]:
    """Place several steps of one pipeline (``place``), side by side in one sweep.

    The orders are fixed, so every pass's time follows from the passes before it in its rank's order and the one
    whose output it needs, whichever way the step is swept. The sweep advances every rank whose next input is
    there by one pass at a time, all ranks at once: a wavefront of array operations, which in a pipeline's
    steady state moves every rank each time (a rank's next pass needs its neighbour's previous one). A sweep
    costs about the same for a few hundred ranks as for one, so steps compared with each other (with and
    without transfers, the candidate orders of a schedule) are swept together, each on ranks and keys of its own.
    ``starts``: keep every pass's start too (``Placed.passes``; else only the ends, all the figures need).
    """
    m = num_microbatches
    ranks = len(steps) * pp
    # Step i's keys: a block of its (rank, kind, microbatch, chunk) keys (``_structure``), then three of its own:
    # the input of a pass that needs none (its time 0), and for a rank past its last pass a pass that never
    # becomes ready (it waits for a key whose time stays NaN, and writes to one never read), so that a rank that is
    # done sits there and the sweep needs no bookkeeping of who is done.
    block = 3 * m * vp * pp + 3
    # Steps that differ only in their transfers share their orders' structure: each structure once, side by side.
    found: dict[tuple[int, int], int] = {}
    structures: list[tuple[np.ndarray, ...]] = []
    for step in steps:
        if (id(step.orders), id(step.chunk_times)) not in found:
            found[(id(step.orders), id(step.chunk_times))] = len(structures)
            structures.append(_structure(step, pp=pp, vp=vp, m=m))
    width = max((len(structure[0]) for structure in structures), default=0)
    # Per pass, position by position and within a position every structure's ranks (the passes placed together
    # lie close in memory); past a rank's last pass, the pass that never runs. In the narrowest types that hold
    # them: a long step's arrays are large, and filling fresh memory is most of what setting up a sweep costs.
    columns = len(structures) * pp
    key = _key_type(len(steps) * block)
    keys = np.full((2, width + 1, columns), block - 1, dtype=key)  # a pass's own key, its input's
    keys[1] = block - 2
    flags = np.zeros((2, width + 1, columns), dtype=bool)  # from another rank, sends to another rank
    took = np.zeros((width + 1, columns))
    for j, (own, dep, remote, duration, sends) in enumerate(structures):
        where = np.s_[: len(own), j * pp : (j + 1) * pp]
        keys[0][where] = np.where(own >= 0, own, block - 1)
        keys[1][where] = np.where(dep >= 0, dep, np.where(dep == NO_INPUT, block - 3, block - 2))
        flags[0][where], took[where], flags[1][where] = remote, duration, sends
    # Separate one-dimensional arrays: a gather from each is several times faster than one from a stacked array.
    own_at, needs_at = keys[0].ravel(), keys[1].ravel()
    remote_at, took_at, sends_at = flags[0].ravel(), took.ravel(), flags[1].ravel()
    # Per rank of the sweep: its structure's column, its step's first key, transfer and blocking send.
    column = np.concatenate([found[(id(s.orders), id(s.chunk_times))] * pp + np.arange(pp) for s in steps])
    base = np.repeat(np.arange(len(steps), dtype=key) * block, pp)
    p2p = np.repeat([s.p2p_time for s in steps], pp)
    hold = np.repeat([s.p2p_time if s.blocking_p2p else 0.0 for s in steps], pp)

    end = np.full(len(steps) * block, np.nan)
    end[base[::pp] + block - 3] = 0.0
    start = np.full(len(steps) * block, np.nan) if starts else end
    at = column.copy()  # every rank's next pass
    clock = np.zeros(ranks)
    left = sum(len(rows) for step in steps for rows in step.orders)
    while left:
        # One pass per rank: those whose input has not arrived get NaN times, written where they already are NaN.
        begin = np.maximum(clock, end[needs_at[at] + base] + remote_at[at] * p2p)
        finish = begin + took_at[at]
        placed = own_at[at] + base
        if starts:
            start[placed] = begin
        end[placed] = finish
        clock = np.fmax(clock, finish + sends_at[at] * hold)
        moved = finish == finish
        count = int(np.count_nonzero(moved))
        if not count:  # cannot happen for Megatron-Core's order; guards against a broken order
            raise RuntimeError("the pipeline order deadlocks: a pass waits for one that never runs")
        left -= count
        at += moved * columns

    def by_rank(times: np.ndarray, i: int) -> np.ndarray:
        """Step ``i``'s times indexed [rank, kind, microbatch, chunk] (a view)."""
        return times[i * block : (i + 1) * block - 3].reshape(m, vp, 3, pp).transpose(3, 2, 0, 1)

    return [
        Placed(start=by_rank(start, i) if starts else None, end=by_rank(end, i), orders=tuple(step.orders))
        for i, step in enumerate(steps)
    ]


NO_INPUT, NO_PASS = -1, -2
"""``_structure``'s key of a pass's input when it needs none, and its keys past a rank's last pass."""


def _key_type(keys: int) -> type[np.signedinteger[Any]]:
    """int32 when ``keys`` keys fit in it (a sweep's keys, and ``_structure``'s), else int64."""
    return np.int32 if keys < np.iinfo(np.int32).max else np.int64


def _structure(step: Step, *, pp: int, vp: int, m: int) -> tuple[np.ndarray, ...]:
    """Per position in the orders (rows) and rank (columns) of ``step``: the pass's key, by (microbatch, chunk,
    kind, rank), ``((mb·v + chunk)·3 + kind)·p + rank``; the key of the pass whose output it needs (``NO_INPUT``:
    none, a W's B runs before it on its rank's order); whether that comes from another rank; its duration;
    whether it sends to another rank (``sending``). Past a rank's last pass, keys ``NO_PASS``. The keys are
    ``_key_type``'s, the two flags bool."""
    orders = step.orders
    times = np.zeros((pp, vp, 3))
    given = np.asarray(step.chunk_times, dtype=float)
    if given.ndim != 3 or given.shape[:2] != (pp, vp) or not 2 <= given.shape[2] <= 3:
        raise ValueError(f"chunk_times must give (forward, backward[, weight]) for {pp} ranks × {vp} chunks")
    times[:, :, : given.shape[2]] = given
    if len(orders) != pp:
        raise ValueError(f"{len(orders)} rank orders given for {pp} pipeline ranks")
    lengths = np.array([len(rows) for rows in orders], dtype=np.int64)
    width = int(lengths.max(initial=0))
    key = _key_type(3 * m * vp * pp)
    table = np.zeros((pp, width, 3), dtype=key)
    for r, rows in enumerate(orders):
        table[r, : len(rows)] = rows
    kind, mb, chunk = np.ascontiguousarray(table.transpose(2, 1, 0))  # rank by rank within a position
    if ((mb >= m) | (chunk >= vp) | (kind > 2) | (kind < 0) | (mb < 0) | (chunk < 0)).any():
        raise ValueError(f"an order names a microbatch or chunk outside m={m}, v={vp}")
    # Per (kind, rank, chunk): the input's key less the pass's (microbatch, chunk) slot's, and where it comes from.
    k, rank, c = np.meshgrid(np.arange(3), np.arange(pp), np.arange(vp), indexing="ij")
    last = rank == pp - 1
    conditions = [
        (k == 0) & (rank > 0),  # the same chunk's output from the previous rank
        (k == 0) & (rank == 0) & (c > 0),  # rank 0: the previous chunk's from the last rank
        (k == 1) & ~last,  # the same chunk's gradient from the next rank
        (k == 1) & last & (c < vp - 1),  # the last rank: the next chunk's from rank 0
        (k == 1) & last,  # the last stage: its own forward
    ]
    offsets = np.select(conditions, [rank - 1, -2 * pp - 1, pp + rank + 1, 4 * pp, rank], default=0).astype(key)
    needs = np.select(conditions, [True] * 5, default=False)
    remote = conditions[0] | conditions[2] | ((conditions[1] | conditions[3]) & (pp > 1))
    sends = np.stack([sending(np.stack([np.full(vp, kk), np.zeros(vp, dtype=np.int64), np.arange(vp)], axis=1),
                              pp=pp, vp=vp, pipeline_rank=r) for kk in range(3) for r in range(pp)])  # fmt: skip
    ranks = np.arange(pp, dtype=key)
    which = (kind * pp + ranks) * vp + chunk  # the pass's (kind, rank, chunk)
    slot = (mb * vp + chunk) * (3 * pp)
    own = slot + kind * pp + ranks
    dep = np.where(needs.ravel()[which], slot + offsets.ravel()[which], NO_INPUT)
    beyond = np.arange(width)[:, None] >= lengths[None, :]
    own[beyond], dep[beyond] = NO_PASS, NO_PASS
    duration = times.transpose(2, 0, 1).ravel()[which]
    return own, dep, remote.ravel()[which], duration, sends.ravel()[which]


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
        rows = [
            schedule_rows(pp=pp, vp=vp, num_microbatches=num_microbatches, pipeline_rank=r, group_size=group_size)
            for r in range(pp)
        ]
    elif len(orders) != pp:
        raise ValueError(f"{len(orders)} rank orders given for {pp} pipeline ranks")
    else:
        rows = [as_rows(order) for order in orders]
    times = chunk_times or uniform_chunk_times(pp=pp, vp=vp, forward_time=forward_time, backward_time=backward_time)
    placed = place(
        rows, pp=pp, vp=vp, num_microbatches=num_microbatches, chunk_times=times, p2p_time=p2p_time,
        blocking_p2p=blocking_p2p,
    )  # fmt: skip
    if chunk_times is not None:
        return Timeline.of_chunk_times(placed.passes(), pp=pp, vp=vp, num_microbatches=num_microbatches,
                                       chunk_times=chunk_times)  # fmt: skip
    return Timeline(pp=pp, vp=vp, num_microbatches=num_microbatches, forward_time=forward_time,
                    backward_time=backward_time, passes=placed.passes())  # fmt: skip


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


def orders_of(schedule: str, *, pp: int, vp: int, num_microbatches: int, group_size: int | None = None) -> list[Rows]:
    """Every rank's order of passes under ``schedule``, as rows."""
    if schedule == "gpipe":
        return [gpipe_rows(pp=pp, num_microbatches=num_microbatches, pipeline_rank=r) for r in range(pp)]
    return [
        schedule_rows(pp=pp, vp=vp, num_microbatches=num_microbatches, pipeline_rank=r, group_size=group_size)
        for r in range(pp)
    ]


def orders_and_counts(
    schedule: str, *, pp: int, vp: int, num_microbatches: int, group_size: int | None
) -> tuple[list[Rows], tuple[int, ...], tuple[int, ...]]:
    """Every rank's order under ``schedule``, the chunks each holds at its peak and the messages each sends."""
    orders = orders_of(schedule, pp=pp, vp=vp, num_microbatches=num_microbatches, group_size=group_size)
    in_flight = tuple(peak_held(o) for o in orders)
    messages = tuple(int(sending(o, pp=pp, vp=vp, pipeline_rank=r).sum()) for r, o in enumerate(orders))
    return orders, in_flight, messages


def whole_steps_together(
    schedule: str,
    *,
    pp: int,
    num_microbatches: int,
    chunk_times: Sequence[Sequence[Sequence[float]]],
    p2p_times: Sequence[float],
    group_sizes: Sequence[int],
) -> dict[int, list[StepFigures]]:
    """Whole steps of ``schedule`` at each of ``group_sizes``, one for each transfer time of ``p2p_times``, placed
    in one sweep (``place_all``): the figures ``schedule_comparison.schedule_figures`` gives each alone, for steps
    it would place whole (``placed_whole``), at the cost of about one of them."""
    if not group_sizes:
        return {}
    vp, m = len(chunk_times[0]), num_microbatches
    steps, counts = [], []
    for group in group_sizes:
        orders, in_flight, messages = orders_and_counts(schedule, pp=pp, vp=vp, num_microbatches=m, group_size=group)
        steps += [Step(orders, chunk_times, t, blocking_p2p=vp == 1) for t in p2p_times]
        counts += [(in_flight, messages)] * len(p2p_times)
    swept = place_all(steps, pp=pp, vp=vp, num_microbatches=m, starts=False)
    placed = [
        StepFigures(makespan=p.makespan, in_flight=in_flight, messages=messages)
        for p, (in_flight, messages) in zip(swept, counts, strict=True)
    ]
    k = len(p2p_times)
    return {group: placed[i * k : (i + 1) * k] for i, group in enumerate(group_sizes)}


def figures_at_scale(
    place: Callable[[int, Sequence[int]], Sequence[tuple[StepFigures, np.ndarray]]],
    *,
    variants: int = 1,
    num_microbatches: int,
    pp: int,
    vp: int = 1,
    group_size: int | None = None,
) -> list[StepFigures]:
    """The figures of each of ``variants`` steps of one pipeline (``place(n, which)``: the steps ``which`` of
    ``n`` microbatches placed together, each one's figures and its passes' end times as ``Placed.end``), read
    off a shorter step when the step is long and that shorter step has reached its steady state.

    A fixed order repeats every ``period`` microbatches past its warm-up (1 without interleaving, the microbatch
    group with it), and its passes' times follow from the times before them by the same max-plus recurrence
    in every repetition. Once every pass of a window of repetitions ends exactly ``λ`` after the same pass one
    repetition earlier, each later repetition does too, up to the cool-down, which is then the shorter step's
    shifted. So the step of ``m`` microbatches is the step of ``n ≡ m`` (modulo the period, so that the last
    group is alike) plus ``(m − n)/period`` times ``λ``; the peaks are the shorter step's (reached in the
    warm-up) and the messages grow with ``m``. With rank 0's warm-up of ``w`` microbatches (``p − 1``, or
    ``(2(p − 1) + (v − 1)·N)/v`` interleaved), ``n`` starts at three spans of ``w + period + 1`` microbatches
    and two periods (warm-up and transient, the window, the cool-down) and doubles until the window repeats
    (a pipeline whose stages are nearly even can take long to settle) or would be more than half the step, which
    is then simulated whole; each variant on its own, those not yet read placed together.
    ``tests/estimate/test_long_steps.py`` checks this against whole steps.
    """
    m = num_microbatches
    period, span, n = _repetition(pp=pp, vp=vp, group_size=group_size)
    found: list[StepFigures | None] = [None] * variants
    pending = list(range(variants))
    while pending and not _too_long(n, num_microbatches=m, period=period):
        n += (m - n) % period
        for which, (figures, end) in zip(pending, place(n, pending), strict=True):
            shift = _steady_shift(end, period=period, span=span, step=figures.makespan)
            if shift is not None:
                found[which] = StepFigures(
                    makespan=figures.makespan + (m - n) // period * shift,
                    in_flight=figures.in_flight,  # reached in the warm-up
                    messages=tuple(k * m // n for k in figures.messages),  # each rank sends per microbatch
                )
        pending = [which for which in pending if found[which] is None]
        n *= 2
    if pending:
        for which, (figures, _) in zip(pending, place(m, pending), strict=True):
            found[which] = figures
    return [figures for figures in found if figures is not None]


def _repetition(*, pp: int, vp: int, group_size: int | None) -> tuple[int, int, int]:
    """(the period an order repeats with, in microbatches; the span of microbatches whose passes wait on each other:
    rank 0's warm-up, unclamped (past it no rank's warm-up depends on m), and a group, over which the table spreads
    a microbatch's chunks; the first shorter step ``figures_at_scale`` tries, three spans and two periods)."""
    period = (group_size or pp) if vp > 1 else 1
    warmup = warmup_passes(pp=pp, vp=vp, num_microbatches=pp * vp * period, pipeline_rank=0, group_size=group_size)
    span = -(-warmup // vp) + period + 1
    return period, span, 3 * span + 2 * period


def placed_whole(*, num_microbatches: int, pp: int, vp: int = 1, group_size: int | None = None) -> bool:
    """Whether ``figures_at_scale`` places the step whole: its first shorter step would be more than half of it."""
    period, _, first = _repetition(pp=pp, vp=vp, group_size=group_size)
    return _too_long(first, num_microbatches=num_microbatches, period=period)


def _too_long(n: int, *, num_microbatches: int, period: int) -> bool:
    """Whether the shorter step ``figures_at_scale`` would place next, ``n`` microbatches raised to be ``≡ m``
    modulo the period, is more than half the step: it would save little, and the step is placed whole."""
    return 2 * (n + (num_microbatches - n) % period) > num_microbatches


def _steady_shift(end: np.ndarray, *, period: int, span: int, step: float) -> float | None:
    """The time every pass of the microbatches ``[n − period − 2·span, n − period − span)`` ends after the same
    pass ``period`` microbatches earlier, when it is one time for all of them (else None); ``end``: the passes'
    end times by [rank, kind, microbatch, chunk] (``Placed.end``, ``n`` microbatches)."""
    high = end.shape[2] - period - span
    low = high - span
    if low < span:
        return None
    shifts = end[:, :, low + period : high + period] - end[:, :, low:high]
    shifts = shifts[~np.isnan(shifts)]  # kinds the order has no passes of
    if not len(shifts) or np.abs(shifts - shifts[0]).max() > STEADY_TOLERANCE * step:
        return None
    return float(shifts[0])
