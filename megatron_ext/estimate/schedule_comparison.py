"""One pipeline under GPipe, 1F1B, interleaved 1F1B and interleaved 1F1B with the best microbatch group.

Each schedule's order (``pipeline_schedule.py``) is simulated pass by pass with the
same per-chunk times, so uneven stages, the output layer on the last stage
and the point-to-point transfers count as they do on the timeline rather than
through a closed form:

* **bubble**: idle share of the step when transfers are free. GPipe and 1F1B
  both idle ``(p − 1)`` stage times, ``(p − 1)/(m + p − 1)`` of the step;
  interleaving with ``v`` chunks cuts it to ``(p − 1)/(v·m + p − 1)``
  (Narayanan et al. 2021, §2.2).
* **exposed p2p**: what the transfers add to the simulated step. 1F1B (and
  GPipe here) send synchronously, interleaved 1F1B overlaps them
  (``pipeline_schedule.simulate``'s ``blocking_p2p``).
* **activations in flight**: the most (microbatch, chunk) passes a rank holds
  at once, read off its order: ``m`` for GPipe, ``p − r`` microbatches on rank
  ``r`` for 1F1B, the warm-up plus one interleaved (``pipeline.in_flight_passes``);
  turned into bytes by the memory model (``memory.estimate_memory``).
* **p2p volume**: the messages the busiest rank sends per step, ``b·s·h``
  elements each (``/t`` when scattered): ``2·m`` without interleaving, ``2·v·m``
  with it (``m`` and ``(2v − 1)·m`` on two-stage pipelines).
* **microbatch group** ``N`` (``--microbatch-group-size-per-virtual-pipeline-stage``,
  Megatron-Core's default ``p``): every valid ``N`` in ``[p, m]`` (the last group
  empty or at least ``p``) is a candidate; more warm-up passes give the
  transfers more compute to hide behind, at ``(v − 1)·(N − p)`` more chunks in
  flight on every rank. The best is the fastest step, the smaller ``N`` (less
  memory) when within ``GROUP_TIE`` of it.

GPipe is not a Megatron-Core schedule: it is shown for comparison only.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from megatron_ext.estimate.flops import layer_forward_flops
from megatron_ext.estimate.memory import estimate_memory
from megatron_ext.estimate.pipeline_schedule import (
    Placed,
    Step,
    StepFigures,
    Timeline,
    figures_at_scale,
    orders_and_counts,
    place_all,
    placed_whole,
    uniform_chunk_times,
    whole_steps_together,
)
from megatron_ext.estimate.search import LayoutEstimate, evaluate, memory_verdict, zero_bubble_possible
from megatron_ext.estimate.step_time import p2p_bandwidth, p2p_message_bytes, unit_times
from megatron_ext.estimate.workload import Workload
from megatron_ext.estimate.zero_bubble import simulate_zero_bubble, zero_bubble_at_scale, zero_bubble_figures
from megatron_ext.parallel.layout import ParallelLayout
from megatron_ext.parallel.pipeline import valid_group_sizes
from megatron_ext.parallel.stages import balanced_layout

SCHEDULES = ("gpipe", "1f1b", "interleaved", "interleaved-group")
"""The schedules compared that Megatron-Core's orders give (``run_schedule``)."""
MEGATRON_ORDERS = ("1f1b", "interleaved", "interleaved-group")
"""The compared schedules that run Megatron-Core's own order of passes (memory counted as the search counts it)."""
ZERO_BUBBLE = ("zb-h1", "zb-interleaved")
"""The zero-bubble schedules compared (``zero_bubble``): ``pretrain_gpt.py --enable-zero-bubble`` runs ZB-H1, and
with virtual stages ZB interleaved."""
GROUP_CANDIDATES = 6
"""Most microbatch group sizes simulated per comparison (spread geometrically over the valid ones)."""
GROUP_TIE = 0.001
"""A larger microbatch group must be this much faster (0.1%) to be preferred: it costs memory."""

ChunkTimes = list[list[tuple[float, float]]]
ChunkTimes3 = list[list[tuple[float, float, float]]]


@dataclass(frozen=True)
class ScheduleRun:
    """One schedule simulated on one pipeline: its step and what its order implies."""

    schedule: str
    """One of ``SCHEDULES``."""
    vp: int
    """Model chunks per rank (1 for GPipe and 1F1B)."""
    group_size: int | None
    """Interleaved 1F1B's microbatch group (None: Megatron-Core's default, ``p``)."""
    makespan: float
    """The step with the point-to-point transfers."""
    compute_makespan: float
    """The same step with free transfers."""
    ideal: float
    """The slowest stage's busy time: ``m`` times its F and B (and W) passes."""
    in_flight_chunks: tuple[int, ...]
    """Peak (microbatch, chunk) passes in flight on every rank."""
    messages: tuple[int, ...]
    """Messages every rank sends to another rank per step."""
    timeline: Timeline | None = None
    """Every pass of the step with the transfers (``whole=True``, for pictures); None when the step was read off
    shorter ones (``pipeline_schedule.figures_at_scale``)."""

    @property
    def bubble_share(self) -> float:
        """Idle share of the step with free transfers (the schedule's own bubble)."""
        span = self.compute_makespan
        return (span - self.ideal) / span if span > 0 else 0.0

    @property
    def p2p_exposed(self) -> float:
        """What the transfers add to the step."""
        return self.makespan - self.compute_makespan

    @property
    def in_flight_microbatches(self) -> tuple[float, ...]:
        return tuple(c / self.vp for c in self.in_flight_chunks)


def _busy(chunk_times: ChunkTimes | ChunkTimes3, num_microbatches: int) -> float:
    """The slowest stage's busy time in a step."""
    return num_microbatches * max(sum(map(sum, row)) for row in chunk_times)


def schedule_figures(
    schedule: str,
    *,
    pp: int,
    num_microbatches: int,
    chunk_times: ChunkTimes,
    p2p_times: Sequence[float],
    group_size: int | None = None,
    whole: bool = False,
) -> list[tuple[StepFigures, Timeline | None]]:
    """Steps of ``schedule`` (``SCHEDULES``) with ``chunk_times[rank][chunk]`` = (forward, backward) of one
    microbatch, one for each transfer time of ``p2p_times`` (placed together): each one's figures, and with
    ``whole`` every pass placed (else a long step is read off shorter ones, ``pipeline_schedule.figures_at_scale``,
    and no timeline is kept)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; one of {', '.join(SCHEDULES)}")
    vp = len(chunk_times[0])
    if schedule in ("gpipe", "1f1b") and vp != 1:
        raise ValueError(f"{schedule} runs one model chunk per rank, got {vp}")

    def place_steps(n: int, which: Sequence[int]) -> list[tuple[StepFigures, Placed]]:
        orders, in_flight, messages = orders_and_counts(
            schedule, pp=pp, vp=vp, num_microbatches=n, group_size=group_size
        )
        steps = [Step(orders, chunk_times, p2p_times[k], blocking_p2p=vp == 1) for k in which]
        return [
            (StepFigures(makespan=placed.makespan, in_flight=in_flight, messages=messages), placed)
            for placed in place_all(steps, pp=pp, vp=vp, num_microbatches=n, starts=whole)
        ]

    def at(n: int, which: Sequence[int]) -> list[tuple[StepFigures, np.ndarray]]:
        return [(figures, placed.end) for figures, placed in place_steps(n, which)]

    if whole:
        picture = functools.partial(Timeline.of_chunk_times, pp=pp, vp=vp, num_microbatches=num_microbatches,
                                    chunk_times=chunk_times)  # fmt: skip
        return [
            (figures, picture(placed.passes()))
            for figures, placed in place_steps(num_microbatches, range(len(p2p_times)))
        ]
    if schedule == "gpipe":
        m = num_microbatches
        return [
            (gpipe_figures(pp=pp, num_microbatches=m, chunk_times=chunk_times, p2p_time=t), None) for t in p2p_times
        ]
    found = figures_at_scale(
        at, variants=len(p2p_times), num_microbatches=num_microbatches, pp=pp, vp=vp, group_size=group_size
    )
    return [(figures, None) for figures in found]


def gpipe_figures(*, pp: int, num_microbatches: int, chunk_times: ChunkTimes, p2p_time: float) -> StepFigures:
    """GPipe's step in closed form, as ``simulate`` places it with blocking sends (``h``: ``p2p_time`` after a
    pass that sends, else 0).

    A pass ends at ``max(its rank's previous end + h, its input's end + p2p) + t``. Every microbatch takes the
    same times, so the longest chain of passes to the forward pass ``k`` on rank ``r`` goes down the ranks once
    and runs its ``k`` repeats on the slowest rank on the way: ``E_F(r, k) = Σ_{j≤r} f_j + r·p2p +
    k·max_{j≤r}(f_j + h_j)``. Rank ``r``'s backward passes start after its last forward pass (``E_F(r, m−1) +
    h``), and the chain to its backward pass ``k`` comes up from some rank ``j ≥ r``: ``E_B(r, k) = max_{j≥r}
    [E_F(j, m−1) + h_j + b_j + Σ_{r≤i<j}(p2p + b_i) + k·max_{r≤i≤j}(b_i + h'_i)]``. The step ends with the
    last backward pass. (The forward passes never wait for a later rank, so the step has no steady state all
    ranks share and is not read off a shorter one; ``tests/estimate/test_long_steps.py`` checks this against
    whole steps.)"""
    m = num_microbatches
    forward = [row[0][0] for row in chunk_times]
    backward = [row[0][1] for row in chunk_times]
    hold_f = [p2p_time if r < pp - 1 else 0.0 for r in range(pp)]
    hold_b = [p2p_time if r > 0 else 0.0 for r in range(pp)]
    last_forward = []
    reach, slowest = -p2p_time, 0.0
    for r in range(pp):
        reach += p2p_time + forward[r]
        slowest = max(slowest, forward[r] + hold_f[r])
        last_forward.append(reach + (m - 1) * slowest)
    step = 0.0
    for r in range(pp):
        climb, slowest = 0.0, 0.0
        for j in range(r, pp):
            slowest = max(slowest, backward[j] + hold_b[j])
            start = last_forward[j] + hold_f[j] + backward[j]
            step = max(step, start + climb + (m - 1) * slowest)
            climb += p2p_time + backward[j]
    return StepFigures(
        makespan=step,
        in_flight=(m,) * pp,  # every forward pass before the first backward
        messages=tuple(m * ((r < pp - 1) + (r > 0)) for r in range(pp)),
    )


def run_schedule(
    schedule: str,
    *,
    pp: int,
    num_microbatches: int,
    chunk_times: ChunkTimes,
    p2p_time: float,
    group_size: int | None = None,
    whole: bool = False,
    simulated: tuple[StepFigures, Timeline | None] | None = None,
    simulated_compute: StepFigures | None = None,
) -> ScheduleRun:
    """Simulate ``schedule`` with ``chunk_times[rank][chunk]`` = (forward, backward) of one microbatch, with the
    transfers and without (``schedule_figures``; ``whole``: keep the step's every pass; ``simulated`` and
    ``simulated_compute``: the step with the transfers and without, already placed)."""
    common: dict[str, Any] = dict(
        pp=pp, num_microbatches=num_microbatches, chunk_times=chunk_times, group_size=group_size, whole=whole
    )
    if simulated is None:  # with the transfers and without, placed together
        runs = schedule_figures(schedule, **common, p2p_times=(p2p_time, 0.0) if p2p_time > 0 else (p2p_time,))
        (step, timeline), compute = runs[0], runs[-1][0]
    else:
        step, timeline = simulated
        if simulated_compute is not None:
            compute = simulated_compute
        else:
            compute = schedule_figures(schedule, **common, p2p_times=(0.0,))[0][0] if p2p_time > 0 else step
    return ScheduleRun(
        schedule=schedule,
        vp=len(chunk_times[0]),
        group_size=group_size,
        makespan=step.makespan,
        compute_makespan=compute.makespan,
        ideal=_busy(chunk_times, num_microbatches),
        in_flight_chunks=step.in_flight,
        messages=step.messages,
        timeline=timeline,
    )


def run_zero_bubble(
    schedule: str,
    *,
    pp: int,
    num_microbatches: int,
    chunk_times: ChunkTimes3,
    p2p_time: float,
    whole: bool = False,
) -> ScheduleRun:
    """Simulate a zero-bubble ``schedule`` (``ZERO_BUBBLE``) with ``chunk_times[rank][chunk]`` = (F, B, W) of one
    microbatch; its transfers delay only the pass that needs them, as the interleaved schedule's do. ``whole``:
    every pass of the step (else a long step is read off shorter ones)."""
    vp = len(chunk_times[0])
    common: dict[str, Any] = dict(pp=pp, num_microbatches=num_microbatches, vp=vp, chunk_times=chunk_times)
    if whole:
        timeline = simulate_zero_bubble(schedule, **common, p2p_time=p2p_time)
        free = simulate_zero_bubble(schedule, **common) if p2p_time > 0 else timeline
        step, compute = zero_bubble_figures(timeline), zero_bubble_figures(free)
        pictured: Timeline | None = Timeline.of_chunk_times(
            timeline.passes, pp=pp, vp=timeline.vp, num_microbatches=num_microbatches, chunk_times=chunk_times
        )
    else:
        # The order chosen, with free transfers too: the schedule's own bubble.
        found, _ = zero_bubble_at_scale(schedule, **common, p2p_times=(p2p_time, 0.0) if p2p_time > 0 else (0.0,))
        step, compute = found[0], found[-1]
        pictured = None
    return ScheduleRun(
        schedule=schedule,
        vp=1 if schedule == "zb-h1" else vp,
        group_size=None,
        makespan=step.makespan,
        compute_makespan=compute.makespan,
        ideal=_busy(chunk_times, num_microbatches),
        in_flight_chunks=step.in_flight,
        messages=step.messages,
        timeline=pictured,
    )


def group_candidates(*, pp: int, num_microbatches: int, limit: int = GROUP_CANDIDATES) -> list[int]:
    """Up to ``limit`` valid group sizes, the smallest first, each at least 1.5× the one before."""
    valid = valid_group_sizes(pp=pp, num_microbatches=num_microbatches)
    picked: list[int] = []
    for n in valid:
        if not picked or n >= 1.5 * picked[-1]:
            picked.append(n)
    if valid and valid[-1] not in picked:
        picked.append(valid[-1])
    return picked[: limit - 1] + picked[-1:] if len(picked) > limit else picked


def best_group(
    *,
    pp: int,
    num_microbatches: int,
    chunk_times: ChunkTimes,
    p2p_time: float,
    default: ScheduleRun | None = None,
    whole: bool = False,
    groups: Sequence[int] | None = None,
) -> tuple[ScheduleRun, dict[int, float]] | None:
    """(the interleaved run with the best group size, every candidate's simulated step), or None when none is valid.

    ``default``: the run at Megatron-Core's default group (``p``), already simulated; ``whole``: the best run
    keeps its step's every pass (``run_schedule``); ``groups``: the sizes to try (``group_candidates``).
    """
    known = {pp: default} if default is not None else {}
    common: dict[str, Any] = dict(pp=pp, num_microbatches=num_microbatches, chunk_times=chunk_times, whole=whole)
    tried = group_candidates(pp=pp, num_microbatches=num_microbatches) if groups is None else groups
    vp = len(chunk_times[0])
    # The groups whose steps are placed whole anyway: all in one sweep, with the transfers and without.
    together = [
        n
        for n in ([] if whole else tried)
        if n not in known and placed_whole(num_microbatches=num_microbatches, pp=pp, vp=vp, group_size=n)
    ]
    p2p_times = (p2p_time, 0.0) if p2p_time > 0 else (p2p_time,)
    swept = whole_steps_together(
        "interleaved-group",
        pp=pp,
        num_microbatches=num_microbatches,
        chunk_times=chunk_times,
        p2p_times=p2p_times,
        group_sizes=together,
    )
    placed: dict[int, tuple[StepFigures, Timeline | None]] = {n: (figures[0], None) for n, figures in swept.items()}
    placed |= {
        n: schedule_figures("interleaved-group", **common, p2p_times=(p2p_time,), group_size=n)[0]
        for n in tried
        if n not in known and n not in placed
    }
    steps = {n: known[n].makespan if n in known else placed[n][0].makespan for n in tried}
    if not steps:
        return None
    fastest = min(steps.values())
    best = next(n for n, step in steps.items() if step <= fastest * (1 + GROUP_TIE))
    if best in known:
        return dataclasses.replace(known[best], schedule="interleaved-group", group_size=best), steps
    compute = swept[best][-1] if best in swept else None
    run = run_schedule("interleaved-group", **common, p2p_time=p2p_time, group_size=best, simulated=placed[best],
                       simulated_compute=compute)  # fmt: skip
    return run, steps


@dataclass(frozen=True, kw_only=True)
class ScheduleOption:
    """One schedule for a layout: the calculator's comparison row."""

    schedule: str
    """One of ``SCHEDULES``."""
    label: str
    """How the row is named."""
    trainable: bool
    """Whether pretrain_gpt.py can run it (GPipe: shown for comparison only)."""
    layout: ParallelLayout | None
    """The layout it runs (VP and group size set), None when it is not possible."""
    reason: str = ""
    """Why it is not possible."""
    run: ScheduleRun | None = None
    """The simulation."""
    step_s: float = 0.0
    """Simulated pipeline step plus the exposed data-parallel communication and the optimizer."""
    activation_bytes: tuple[float, ...] = ()
    """Peak activation memory of every stage under this schedule."""
    peak_bytes: float = 0.0
    """Total memory of the most loaded stage."""
    verdict: str = "does not fit"
    """``peak_bytes`` against the GPU as the layouts are judged (``LayoutEstimate.verdict``): ``fits`` within the
    usable memory, ``tight`` within the capacity, else ``does not fit``."""
    as_given: bool = False
    """The evaluated layout's own schedule (its VP, microbatch group and zero-bubble choice)."""
    p2p_bytes: float = 0.0
    """Bytes the busiest rank sends to other pipeline ranks per step."""

    @property
    def fits(self) -> bool:
        """Not above the card's capacity (``fits`` or ``tight``), as ``LayoutEstimate.fits``."""
        return self.verdict != "does not fit"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schedule": self.schedule,
            "label": self.label,
            "trainable": self.trainable,
            "possible": self.run is not None,
        }
        if self.run is None or self.layout is None:
            return out | {"reason": self.reason}
        return out | {
            "vp": self.layout.vp,
            "microbatch_group_size": self.run.group_size,
            "bubble_share_of_step": self.run.bubble_share,
            "p2p_exposed_s": self.run.p2p_exposed,
            "step_time_s": self.step_s,
            "in_flight_microbatches": list(self.run.in_flight_microbatches),
            "activation_bytes": [int(b) for b in self.activation_bytes],
            "peak_memory_bytes": int(self.peak_bytes),
            "fits": self.fits,
            "memory_verdict": self.verdict,
            "as_given": self.as_given,
            "p2p_bytes_per_step": int(self.p2p_bytes),
        }


def _relayout(layout: ParallelLayout, **changes: Any) -> tuple[ParallelLayout | None, list[str]]:
    """``layout`` with ``changes``: (the new layout, []) when Megatron-Core would run it, else (None, why not)."""
    candidate, problems = ParallelLayout.check(**layout.as_values() | changes)
    return (None if problems else candidate), problems


def _with_vp(workload: Workload, estimate: LayoutEstimate, vp: int | None) -> dict[str, Any]:
    """The changes that give ``estimate``'s layout ``vp`` model chunks per rank. A layout string sets VP by its
    length, so it is replaced by the balanced string for ``vp`` chunks, as the search places such a layout
    (``stages.balanced_splits``: the loss weighing what it costs in layers at this TP and micro-batch)."""
    layout = estimate.layout
    changes: dict[str, Any] = {"virtual_pipeline_model_parallel_size": vp}
    if layout.pipeline_model_parallel_layout is not None:
        cluster = estimate.cluster
        loss = unit_times(workload, layout, cluster.gpu, gpus_per_node=cluster.gpus_per_node).output_in_layers
        text = balanced_layout(layout.num_layers, layout.pp, vp or 1, embedding=0.0, loss=loss)
        changes["pipeline_model_parallel_layout"] = text or None
    return changes


def _model_chunk_times(workload: Workload, estimate: LayoutEstimate) -> Callable[[ParallelLayout], ChunkTimes]:
    """(forward, backward) of one microbatch through every chunk of a layout with ``estimate``'s TP, MB, SP, CP."""
    split = _split_chunk_times(workload, estimate)
    return lambda candidate: [[(f, b + w) for f, b, w in row] for row in split(candidate)]


def _split_chunk_times(workload: Workload, estimate: LayoutEstimate) -> Callable[[ParallelLayout], ChunkTimes3]:
    """(F, B, W) of one microbatch through every chunk: the backward split into its input-gradient part B and
    its weight-gradient GEMMs W (``UnitTimes.layer_weight_grad_s``)."""
    layout, cluster = estimate.layout, estimate.cluster
    units = unit_times(workload, layout, cluster.gpu, gpus_per_node=cluster.gpus_per_node)
    layer = units.layer_compute_s + units.layer_tp_s + units.layer_cp_s
    # Backward is twice the forward's FLOPs; recomputation runs in the backward pass.
    forward_flops = layer_forward_flops(workload.model, sequences=layout.micro_batch_size) / layout.cp
    forward_share = 1 / (3 + units.recompute_flops / forward_flops)

    def times(candidate: ParallelLayout) -> ChunkTimes3:
        p, v = candidate.pp, candidate.vp
        out = []
        for r in range(p):
            row = []
            for c in range(v):
                n = candidate.stages[r][c].num_layers
                layers = n * layer
                last = (r, c) == (p - 1, v - 1)
                output, output_forward = (units.output_compute_s, units.output_forward_s) if last else (0.0, 0.0)
                weights = n * units.layer_weight_grad_s  # the output layer keeps its W in B (split_backward)
                backward = layers * (1 - forward_share) + output - output_forward
                row.append((layers * forward_share + output_forward, backward - weights, weights))
            out.append(row)
        return out

    return times


def _interleaved_layout(workload: Workload, estimate: LayoutEstimate) -> tuple[ParallelLayout | None, str]:
    """The layout's own VP, or when it has none, the VP the closed-form model finds fastest."""
    layout = estimate.layout
    if layout.vp > 1:
        return _relayout(layout, microbatch_group_size_per_vp_stage=None)[0] or layout, ""
    best: LayoutEstimate | None = None
    reasons = []
    # Every VP that Megatron-Core could split into (the checks say which): with the embedding and the loss
    # counted in the split, a rank's share of slots is not its layer count.
    for v in range(2, max(layout.layers_per_rank) + 3):
        candidate, problems = _relayout(layout, **_with_vp(workload, estimate, v))
        if candidate is None:
            reasons.append(problems[0])
            continue
        e = evaluate(workload, candidate, estimate.cluster)
        if best is None or e.time.step_s < best.time.step_s:
            best = e
    if best is None:
        return None, reasons[0] if reasons else "one layer per pipeline rank: nothing to interleave"
    return best.layout, ""


def compare_schedules(workload: Workload, estimate: LayoutEstimate) -> list[ScheduleOption]:
    """The layout under every schedule of ``SCHEDULES`` (empty when PP = 1: no pipeline)."""
    layout, cluster = estimate.layout, estimate.cluster
    if layout.pp == 1:
        return []
    chunk_times = _model_chunk_times(workload, estimate)
    split_times = _split_chunk_times(workload, estimate)
    p2p_bytes = p2p_message_bytes(workload, layout)
    p2p_time = p2p_bytes / p2p_bandwidth(layout, cluster.gpu, gpus_per_node=cluster.gpus_per_node)
    m = layout.num_microbatches

    # The non-pipeline parts of a step (DP communication, optimizer); GPipe and 1F1B share their layout.
    evaluated = functools.cache(lambda candidate: evaluate(workload, candidate, cluster))

    def option(schedule: str, candidate: ParallelLayout, run: ScheduleRun) -> ScheduleOption:
        # Megatron-Core's own orders (the candidate carries its group size): each chunk held for its span, as the
        # search counts it; GPipe's and zero bubble's: their simulated counts at the largest chunk.
        own_order = schedule in MEGATRON_ORDERS
        memory = estimate_memory(workload, candidate, in_flight=None if own_order else run.in_flight_chunks)
        own = evaluated(candidate)
        group = candidate.microbatch_group_size_per_vp_stage or candidate.pp
        as_given = (
            schedule != "gpipe"
            and candidate.vp == layout.vp
            and group == (layout.microbatch_group_size_per_vp_stage or layout.pp)
            and (schedule in ZERO_BUBBLE) == workload.zero_bubble
        )
        return ScheduleOption(
            schedule=schedule,
            label=schedule_label(run),
            trainable=schedule != "gpipe"
            and (schedule not in ZERO_BUBBLE or zero_bubble_possible(workload, pp=candidate.pp)),
            layout=candidate,
            run=run,
            step_s=run.makespan + own.time.dp_comm_s + own.time.optimizer_s + own.time.housekeeping_s,
            activation_bytes=tuple(st.activations_bytes for st in memory.stages),
            peak_bytes=memory.total_bytes,
            verdict=memory_verdict(memory.total_bytes, cluster),
            as_given=as_given,
            p2p_bytes=max(run.messages) * p2p_bytes,
        )

    options = []
    flat, problems = _relayout(layout, **_with_vp(workload, estimate, None), microbatch_group_size_per_vp_stage=None)
    for schedule, label in (("gpipe", "GPipe (comparison only)"), ("1f1b", "1F1B")):
        if flat is None:
            options.append(ScheduleOption(schedule=schedule, label=label, trainable=schedule != "gpipe", layout=None,
                                          reason=problems[0]))  # fmt: skip
            continue
        run = run_schedule(schedule, pp=layout.pp, num_microbatches=m, chunk_times=chunk_times(flat), p2p_time=p2p_time)
        options.append(option(schedule, flat, run))
    if flat is not None:
        run = run_zero_bubble("zb-h1", pp=layout.pp, num_microbatches=m, chunk_times=split_times(flat),
                              p2p_time=p2p_time)  # fmt: skip
        options.append(option("zb-h1", flat, run))

    interleaved, reason = _interleaved_layout(workload, estimate)
    if interleaved is None:
        for schedule, label in (("interleaved", "interleaved 1F1B (N = PP, the default)"),
                                ("interleaved-group", "interleaved 1F1B (best N)"),
                                ("zb-interleaved", "ZB interleaved (--enable-zero-bubble)")):  # fmt: skip
            options.append(ScheduleOption(schedule=schedule, label=label, trainable=True, layout=None, reason=reason))
        return options
    v = interleaved.vp
    times = chunk_times(interleaved)
    default, problems = _relayout(interleaved, microbatch_group_size_per_vp_stage=None)
    if default is None:
        options.append(ScheduleOption(schedule="interleaved", label=f"interleaved 1F1B (VP {v})", trainable=True,
                                      layout=None, reason=problems[0]))  # fmt: skip
    else:
        run = run_schedule("interleaved", pp=layout.pp, num_microbatches=m, chunk_times=times, p2p_time=p2p_time)
        options.append(option("interleaved", default, run))

    def fits_with(group: int) -> bool:
        candidate, _ = _relayout(interleaved, microbatch_group_size_per_vp_stage=group)
        return candidate is not None and estimate_memory(workload, candidate).total_bytes <= cluster.gpu.memory_bytes

    found = best_group(
        pp=layout.pp,
        num_microbatches=m,
        chunk_times=times,
        p2p_time=p2p_time,
        default=options[-1].run if options[-1].schedule == "interleaved" else None,
        # A group whose warm-up activations do not fit is no choice (and the longest steps to simulate).
        groups=[n for n in group_candidates(pp=layout.pp, num_microbatches=m) if n == layout.pp or fits_with(n)],
    )
    if found is None:
        options.append(ScheduleOption(schedule="interleaved-group", label=f"interleaved 1F1B (VP {v}, best N)",
                                      trainable=True, layout=None,
                                      reason=f"no microbatch group size suits {m} microbatches on PP {layout.pp}"))  # fmt: skip
        return options
    best, _ = found
    grouped, _ = _relayout(interleaved, microbatch_group_size_per_vp_stage=best.group_size)
    assert grouped is not None  # group_candidates only yields sizes Megatron-Core accepts
    options.append(option("interleaved-group", grouped, best))
    if default is not None:
        run = run_zero_bubble("zb-interleaved", pp=layout.pp, num_microbatches=m, chunk_times=split_times(default),
                              p2p_time=p2p_time)  # fmt: skip
        options.append(option("zb-interleaved", default, run))
    return options


def runs_for_picture(
    *,
    pp: int,
    vp: int,
    num_microbatches: int,
    forward_time: float,
    backward_time: float,
    p2p_time: float,
    weight_time: float | None = None,
) -> list[ScheduleRun]:
    """GPipe, 1F1B, and with ``vp > 1`` interleaved 1F1B at the default and the best group size: equal stages.
    With ``weight_time`` (the part of ``backward_time`` that computes weight gradients), ZB-H1 after 1F1B and ZB
    interleaved after interleaved 1F1B."""
    flat = uniform_chunk_times(pp=pp, vp=1, forward_time=forward_time, backward_time=backward_time)
    common: dict[str, Any] = dict(pp=pp, num_microbatches=num_microbatches, p2p_time=p2p_time, whole=True)

    def split(v: int) -> ChunkTimes3:
        assert weight_time is not None
        return [[(forward_time / v, (backward_time - weight_time) / v, weight_time / v)] * v for _ in range(pp)]

    runs = [run_schedule(s, chunk_times=flat, **common) for s in ("gpipe", "1f1b")]
    if weight_time is not None:
        runs.append(run_zero_bubble("zb-h1", chunk_times=split(1), **common))
    if vp > 1:
        times = uniform_chunk_times(pp=pp, vp=vp, forward_time=forward_time, backward_time=backward_time)
        runs.append(run_schedule("interleaved", chunk_times=times, **common))
        default = runs[-1]
        found = best_group(chunk_times=times, default=default, **common)
        if found is not None:
            runs.append(found[0])
        if weight_time is not None:
            runs.append(run_zero_bubble("zb-interleaved", chunk_times=split(vp), **common))
    return runs


def schedule_label(run: ScheduleRun) -> str:
    """How a run is named in tables and pictures."""
    if run.schedule == "gpipe":
        return "GPipe (comparison only)"
    if run.schedule == "1f1b":
        return "1F1B"
    if run.schedule == "zb-h1":
        return "ZB-H1 (--enable-zero-bubble)"
    if run.schedule == "zb-interleaved":
        return f"ZB interleaved (VP {run.vp}; --enable-zero-bubble)"
    if run.schedule == "interleaved":
        return f"interleaved 1F1B (VP {run.vp}, N = PP, the default)"
    return f"interleaved 1F1B (VP {run.vp}, best N = {run.group_size})"


def in_flight_curve(run: ScheduleRun, rank: int) -> list[tuple[float, float, int]]:
    """(start, end, chunks held) over one rank's simulated step: held from a forward pass's end to its backward's
    (its W pass's, in a zero-bubble schedule)."""
    if run.timeline is None:
        raise ValueError("in_flight_curve needs the step's every pass: simulate it whole (whole=True)")
    release = "W" if run.schedule in ZERO_BUBBLE else "B"
    passes = [p for p in run.timeline.passes if p.rank == rank and p.step.kind in ("F", release)]
    events = sorted((p.end, 1 if p.step.kind == "F" else -1) for p in passes)
    out, live = [], 0
    for (time, delta), following in zip(events, [*events[1:], None], strict=True):
        live += delta
        if following is not None and following[0] > time:
            out.append((time, following[0], live))
    return out
