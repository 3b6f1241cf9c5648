"""Command line of ``tools/plot_schedule.py``: draw a pipeline timeline and print its bubble."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from megatron_ext.config.exit_codes import ExitCode
from megatron_ext.config.layout import LayoutError
from megatron_ext.estimate.schedule import PipelinePass, schedule_order, simulate, validate
from megatron_ext.estimate.schedule_plot import write


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tools/plot_schedule.py",
        description="Draw Megatron-Core's 1F1B / interleaved 1F1B pipeline timeline (PNG and SVG).",
        allow_abbrev=False,
    )
    parser.add_argument(
        "--pp", "--pipeline-model-parallel-size", dest="pp", type=int, required=True, help="Pipeline ranks p."
    )
    parser.add_argument(
        "--vp",
        "--virtual-pipeline-model-parallel-size",
        dest="vp",
        type=int,
        default=1,
        help="Model chunks per rank v.",
    )
    parser.add_argument("--num-microbatches", "-m", type=int, required=True, help="Microbatches per step m.")
    parser.add_argument(
        "--forward-time", type=float, default=1.0, help="Forward time of a microbatch through one stage (default 1)."
    )
    parser.add_argument(
        "--backward-time", type=float, default=2.0, help="Backward time of a microbatch through one stage (default 2)."
    )
    parser.add_argument("--p2p-time", type=float, default=0.0, help="Time to pass activations between ranks.")
    parser.add_argument("--output", type=Path, help="Output stem (default schedule_p<P>_v<V>_m<M>): .png and .svg.")
    parser.add_argument("--width", type=int, default=1200, help="Picture width in pixels (default 1200).")
    parser.add_argument("--trace", type=Path, help="Draw a recorded order (tools/record_schedule.py's directory).")
    parser.add_argument("--print-order", action="store_true", help="Also print every rank's order.")
    return parser


def main(argv: Sequence[str] | None = None, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    out, err = stdout or sys.stdout, stderr or sys.stderr
    args = build_parser().parse_args(argv)
    try:
        validate(pp=args.pp, vp=args.vp, num_microbatches=args.num_microbatches)
    except LayoutError as exc:
        print(f"error: {exc}", file=err)
        return ExitCode.INVALID
    if args.width < 400:
        print(f"error: --width must be at least 400 pixels, got {args.width}", file=err)
        return ExitCode.INVALID
    orders: list[list[PipelinePass]] | None = None
    if args.trace is not None:
        from megatron_ext.training.schedule_trace import load_trace

        recorded = load_trace(args.trace)
        per_step = 2 * args.num_microbatches * args.vp
        if sorted(recorded) != list(range(args.pp)) or any(len(o) < per_step for o in recorded.values()):
            print(
                f"error: {args.trace} does not hold one step of p={args.pp}, v={args.vp}, m={args.num_microbatches} "
                f"for every pipeline rank (found ranks {sorted(recorded)})",
                file=err,
            )
            return ExitCode.INVALID
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
        print(f"error: {exc}", file=err)
        return ExitCode.INVALID
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
