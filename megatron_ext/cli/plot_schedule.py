"""Command line of ``tools/plot_schedule.py``: draw a pipeline timeline and print its bubble."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO, cast

from megatron_ext.config.exit_codes import ExitCode, fail
from megatron_ext.estimate.pipeline_schedule import (
    PipelinePass,
    TimedPass,
    Timeline,
    schedule_order,
    simulate,
    validate,
)
from megatron_ext.estimate.schedule_comparison import in_flight_curve, run_zero_bubble, runs_for_picture, schedule_label
from megatron_ext.estimate.schedule_plot import MemoryStrip, write, write_comparison
from megatron_ext.parallel.layout import LayoutError
from megatron_ext.parallel.pipeline import stage_imbalance
from megatron_ext.training.chrome_trace import load_timeline


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tools/plot_schedule.py",
        description="Draw Megatron-Core's 1F1B / interleaved 1F1B pipeline timeline (PNG and SVG).",
        allow_abbrev=False,
    )
    parser.add_argument("--pp", "--pipeline-model-parallel-size", dest="pp", type=int, help="Pipeline ranks p.")
    parser.add_argument(
        "--vp",
        "--virtual-pipeline-model-parallel-size",
        dest="vp",
        type=int,
        default=1,
        help="Model chunks per rank v.",
    )
    parser.add_argument("--num-microbatches", "-m", type=int, help="Microbatches per step m.")
    parser.add_argument(
        "--forward-time", type=float, default=1.0, help="Forward time of a microbatch through one stage (default 1)."
    )
    parser.add_argument(
        "--backward-time", type=float, default=2.0, help="Backward time of a microbatch through one stage (default 2)."
    )
    parser.add_argument(
        "--weight-grad-time",
        type=float,
        help="The part of the backward time that computes weight gradients (a zero-bubble schedule's W pass; "
        "default half of it, as a layer's GEMMs split it): with --compare-schedules, draws ZB-H1 and ZB "
        "interleaved too (pretrain_gpt.py --enable-zero-bubble runs both).",
    )
    parser.add_argument("--p2p-time", type=float, default=0.0, help="Time to pass activations between ranks.")
    parser.add_argument("--output", type=Path, help="Output stem (default schedule_p<P>_v<V>_m<M>): .png and .svg.")
    parser.add_argument("--width", type=int, default=1200, help="Picture width in pixels (default 1200).")
    parser.add_argument("--trace", type=Path, help="Draw a recorded order (tools/record_schedule.py's directory).")
    parser.add_argument(
        "--timeline",
        type=Path,
        help="Draw a measured run (pretrain_gpt.py --timeline's trace) above its simulation with the measured "
        "per-stage times; p, v and m come from the trace.",
    )
    parser.add_argument("--print-order", action="store_true", help="Also print every rank's order.")
    parser.add_argument(
        "--compare-schedules",
        action="store_true",
        help="Draw GPipe (for comparison: not a Megatron-Core schedule), 1F1B and, with --vp > 1, interleaved "
        "1F1B at the default and the best microbatch group, one above the other on one time axis, each with "
        "rank 0's activations in flight; print their bubble, p2p and memory side by side.",
    )
    return parser


def main(argv: Sequence[str] | None = None, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    out, err = stdout or sys.stdout, stderr or sys.stderr
    args = build_parser().parse_args(argv)
    if args.timeline is not None:
        return _measured(args, out, err)
    if args.pp is None or args.num_microbatches is None:
        return fail("give --pp and --num-microbatches, or --timeline TRACE (see --help)", ExitCode.INVALID, file=err)
    try:
        validate(pp=args.pp, vp=args.vp, num_microbatches=args.num_microbatches)
    except LayoutError as exc:
        return fail(exc, ExitCode.INVALID, file=err)
    if args.width < 400:
        return fail(f"--width must be at least 400 pixels, got {args.width}", ExitCode.INVALID, file=err)
    if args.compare_schedules:
        weight = args.backward_time / 2 if args.weight_grad_time is None else args.weight_grad_time
        if not 0 < weight < args.backward_time:
            return fail(
                f"--weight-grad-time must be above 0 and below the backward time, got {weight:g}",
                ExitCode.INVALID,
                file=err,
            )
        return _compare(args, out, weight)
    orders: list[list[PipelinePass]] | None = None
    if args.trace is not None:
        from megatron_ext.training.schedule_trace import load_trace

        recorded = load_trace(args.trace)
        per_step = 2 * args.num_microbatches * args.vp
        if sorted(recorded) != list(range(args.pp)) or any(len(o) < per_step for o in recorded.values()):
            return fail(
                f"{args.trace} does not hold one step of p={args.pp}, v={args.vp}, m={args.num_microbatches} "
                f"for every pipeline rank (found ranks {sorted(recorded)})",
                ExitCode.INVALID,
                file=err,
            )
        orders = [recorded[r][:per_step] for r in range(args.pp)]
    try:
        timeline = simulate(
            pp=args.pp,
            vp=args.vp,
            num_microbatches=args.num_microbatches,
            forward_time=args.forward_time,
            backward_time=args.backward_time,
            p2p_time=args.p2p_time,
            orders=orders,
        )
    except (ValueError, RuntimeError) as exc:
        return fail(exc, ExitCode.INVALID, file=err)
    stem = args.output or Path(f"schedule_p{args.pp}_v{args.vp}_m{args.num_microbatches}")
    png, svg = write(timeline, stem, width=args.width)
    p, v, m = args.pp, args.vp, args.num_microbatches
    print(
        f"bubble: formula (p-1)/(v*m) = {p - 1}/({v}*{m}) = {timeline.formula_bubble:.2%} of the ideal time; "
        f"timeline: {timeline.bubble_of_ideal:.2%} of the ideal = {timeline.bubble_of_step:.2%} of the step "
        f"({timeline.makespan:g} vs ideal {timeline.ideal:g})",
        file=out,
    )
    if args.print_order:
        for rank in range(p):
            order = orders[rank] if orders else schedule_order(pp=p, vp=v, num_microbatches=m, pipeline_rank=rank)
            print(f"rank {rank}: " + " ".join(f"{s.kind}{s.microbatch}.{s.chunk}" for s in order), file=out)
    print(f"wrote {png} and {svg}", file=out)
    return ExitCode.OK


def _compare(args: argparse.Namespace, out: TextIO, weight_time: float) -> int:
    p, v, m = args.pp, args.vp, args.num_microbatches
    runs = runs_for_picture(
        pp=p,
        vp=v,
        num_microbatches=m,
        forward_time=args.forward_time,
        backward_time=args.backward_time,
        p2p_time=args.p2p_time,
        weight_time=weight_time,
    )
    scale = max(max(r.in_flight_microbatches) for r in runs)
    panels = []
    print(
        f"p={p} m={m}, stage forward {args.forward_time:g} + backward {args.backward_time:g}, p2p {args.p2p_time:g}; "
        "GPipe is not a Megatron-Core schedule: shown for comparison only; zero-bubble W passes take "
        f"{weight_time:g} of the backward",
        file=out,
    )
    print(f"{'schedule':<46} {'bubble':>7} {'p2p':>7} {'step':>9} {'rank 0 in flight':>16} {'messages':>8}", file=out)
    for run in runs:
        label = schedule_label(run)
        peak = run.in_flight_microbatches[0]
        print(
            f"{label:<46} {run.bubble_share:>7.2%} {run.p2p_exposed:>7.3g} {run.makespan:>9.4g} "
            f"{peak:>16.3g} {max(run.messages):>8}",
            file=out,
        )
        heading = (
            f"{label}: step {run.makespan:g}, bubble {run.bubble_share:.1%} of the step, rank 0 holds up "
            f"to {peak:g} microbatches of activations"
        )
        curve = [(a, b, live / run.vp) for a, b, live in in_flight_curve(run, 0)]
        assert run.timeline is not None  # runs_for_picture simulates every pass
        panels.append((run.timeline, heading, MemoryStrip(f"peak {peak:g} microbatches", curve, scale)))
    stem = args.output or Path(f"schedules_p{p}_v{v}_m{m}")
    png, svg = write_comparison(panels, stem, width=args.width)
    print(f"wrote {png} and {svg}", file=out)
    return ExitCode.OK


def measured_timeline(passes: dict[int, list[TimedPass]]) -> Timeline:
    """One measured step (passes per pipeline rank) as a Timeline starting at 0."""
    every = [p for rank in sorted(passes) for p in passes[rank]]
    origin = min(p.start for p in every)
    vp = 1 + max(p.step.chunk for p in every)
    m = 1 + max(p.step.microbatch for p in every)
    busy = [sum(p.end - p.start for p in passes[r]) for r in sorted(passes)]
    slowest = busy.index(max(busy))
    forward = sum(p.end - p.start for p in passes[slowest] if p.step.kind == "F") / m
    return Timeline(
        pp=len(passes), vp=vp, num_microbatches=m, forward_time=forward, backward_time=max(busy) / m - forward,
        passes=tuple(TimedPass(p.rank, p.step, p.start - origin, p.end - origin) for p in every),
    )  # fmt: skip


def chunk_times(passes: dict[int, list[TimedPass]], vp: int, kinds: str = "FB") -> list[list[tuple[float, ...]]]:
    """Mean measured time of one microbatch's pass of each kind (F, B and, split, W) through every [rank][chunk]."""
    out = []
    for rank in sorted(passes):
        row = []
        for chunk in range(vp):
            times = []
            for kind in kinds:
                spans = [p.end - p.start for p in passes[rank] if p.step.kind == kind and p.step.chunk == chunk]
                times.append(sum(spans) / len(spans) if spans else 1e-9)
            row.append(tuple(times))
        out.append(row)
    return out


def _measured(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        by_stage = load_timeline(args.timeline)
    except (OSError, ValueError, KeyError) as exc:
        return fail(f"{args.timeline} is not a trace of pretrain_gpt.py --timeline ({exc})", ExitCode.INVALID, file=err)
    if not by_stage or sorted(by_stage) != list(range(len(by_stage))) or not all(by_stage.values()):
        return fail(f"{args.timeline} does not hold a step for every pipeline rank", ExitCode.INVALID, file=err)
    step = {rank: steps[-1] for rank, steps in by_stage.items()}  # the last step kept: steady state
    measured = measured_timeline(step)
    p, v, m = measured.pp, measured.vp, measured.num_microbatches
    # A zero-bubble run (W passes in the trace) beside its own schedule simulated, else Megatron-Core's 1F1B.
    split = any(q.step.kind == "W" for passes in step.values() for q in passes)
    times = chunk_times(step, v, "FBW" if split else "FB")
    schedule = "zb-interleaved" if v > 1 else "zb-h1"
    if split:
        pictured = run_zero_bubble(
            schedule, pp=p, num_microbatches=m, chunk_times=cast(Any, times), p2p_time=0.0, whole=True
        ).timeline
        assert pictured is not None  # whole: every pass placed
        simulated = pictured
    else:
        simulated = simulate(pp=p, vp=v, num_microbatches=m, chunk_times=cast(Any, times))
    busy = [sum(map(sum, row)) * m for row in times]
    slowest = busy.index(max(busy))
    imbalance = stage_imbalance(busy)
    notes = [" *" if r == slowest else "" for r in range(p)]
    per_rank = ", ".join(f"{b * 1000:.0f}" for b in busy)
    panels = [
        (measured, f"measured: p={p} v={v} m={m}, step {measured.makespan * 1000:.1f} ms; busy ms per rank "
                   f"{per_rank}; stage imbalance {imbalance:.1%} (* slowest: rank {slowest})", notes),
        (simulated, f"simulated{' (' + schedule + ')' if split else ''} with the measured per-stage times: step {simulated.makespan * 1000:.1f} ms, "
                    f"bubble {simulated.bubble_of_step:.1%} of the step", notes),
    ]  # fmt: skip
    stem = args.output or args.timeline.with_suffix("")
    png, svg = write(measured, stem, width=args.width, panels=panels)
    print(
        f"measured step {measured.makespan * 1000:.1f} ms, simulated{' ' + schedule if split else ''} "
        f"{simulated.makespan * 1000:.1f} ms; "
        f"stage imbalance {imbalance:.1%}, slowest pipeline rank {slowest}; idle share of the measured step "
        f"{1 - sum(busy) / (len(busy) * measured.makespan):.1%}",
        file=out,
    )
    print(f"wrote {png} and {svg}", file=out)
    return ExitCode.OK
