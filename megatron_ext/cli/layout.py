"""Command line of ``tools/layout.py``: the 3D-parallel layout calculator.

Search mode (default) enumerates every valid TP × CP × PP × VP × DP ×
micro-batch layout for a GPU count and ranks those that fit in memory by
estimated step time. Evaluate mode (any of ``--tp/--cp/--pp/--vp`` or their ``pretrain_gpt.py``
names given) estimates one layout and explains it. Model and training flags
are ``pretrain_gpt.py``'s, so a recipe passes the same ones to both.

Exit codes (documented in ``docs/layout-model.md``):

====  ==============================================================
0     the layout (or, searching, at least one layout) is valid and fits
2     invalid input or layout: the messages on stderr are the ones
      ``pretrain_gpt.py`` prints for the same flags
5     valid, but estimated not to fit in GPU memory (by how much and
      what to change on stderr)
====  ==============================================================
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import typing
from collections.abc import Sequence

from megatron_ext.cli import layout_calibrate
from megatron_ext.cli import layout_report as report
from megatron_ext.cli.layout_args import (
    LayoutToolError,
    build_parser,
    cluster_of,
    evaluate_layout_from_flags,
    workload_of,
)
from megatron_ext.config.arguments import BatchArgs, ConfigError, ParallelArgs
from megatron_ext.config.exit_codes import ExitCode, fail
from megatron_ext.config.flags import value_type
from megatron_ext.config.layout_flags import LAYOUT_FLAGS
from megatron_ext.estimate.derived_numbers import zero_bubble_line
from megatron_ext.estimate.fp8 import fp8_peak
from megatron_ext.estimate.relayout import DEFAULT_POLICY, RelayoutError, describe, relayout
from megatron_ext.estimate.schedule_comparison import compare_schedules
from megatron_ext.estimate.search import Cluster, better_split, evaluate, search_like, search_with_savers
from megatron_ext.estimate.workload import Workload
from megatron_ext.parallel.layout import LayoutError
from megatron_ext.parallel.stages import SPLIT_FIELDS

LAYOUT_FACTORS = sorted(name for name in LAYOUT_FLAGS if value_type(ParallelArgs, name)[0] is not bool)
"""The layout flags that are no switch: any of them given selects evaluate mode."""
ACCOUNT_FOR = sorted(name for name in SPLIT_FIELDS if value_type(ParallelArgs, name)[0] is bool)
"""The placement switches (the account-for flags): given in search mode, every candidate splits its layers by them."""


def main(
    argv: Sequence[str] | None = None, *, stdout: typing.TextIO | None = None, stderr: typing.TextIO | None = None
) -> int:
    """Parse, estimate, print; returns the exit code."""
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    args = build_parser().parse_args(argv)
    if args.calibrate is not None:
        return layout_calibrate.run(args, out, err)
    try:
        if args.profile_out is not None or args.profile_name is not None:
            raise LayoutToolError("--profile-out and --profile-name go with --calibrate METRICS [...]")
        cluster = cluster_of(args)
        workload, preset_batch = workload_of(args)
        if workload.fp8_format:
            try:
                fp8_peak(workload, cluster.gpu)
            except ValueError as exc:
                raise LayoutToolError(str(exc)) from None
        if args.top < 1:
            raise LayoutToolError(f"--top must be at least 1, got {args.top}")
        batch = args.global_batch_size if args.global_batch_size is not None else preset_batch
        # The batch flags' own bounds, as pretrain_gpt.py checks them (the layout rules come later).
        BatchArgs(
            micro_batch_size=1 if args.micro_batch_size is None else args.micro_batch_size, global_batch_size=batch
        )
    except (LayoutToolError, ConfigError) as exc:
        return fail(exc, ExitCode.INVALID, file=err)
    # A layout factor given (a layout flag that is no switch: TP, CP, PP, VP, the stage sizes, a layout string, a
    # microbatch group) evaluates it.
    evaluate_mode = any(getattr(args, name) is not None for name in LAYOUT_FACTORS)
    if args.relayout_from_gpus is not None:
        return _relayout_mode(args, workload, cluster, batch, out, err)
    if args.relayout_policy is not None:
        return fail("--relayout-policy goes with --relayout-from-gpus N (the GPU count the layout ran on)",
                    ExitCode.INVALID, file=err)  # fmt: skip
    if evaluate_mode:
        return _evaluate_mode(args, workload, cluster, batch, out, err)
    return _search_mode(args, workload, cluster, batch, out, err)


def _evaluate_mode(
    args: argparse.Namespace,
    workload: Workload,
    cluster: Cluster,
    batch: int | None,
    out: typing.TextIO,
    err: typing.TextIO,
) -> int:
    try:
        layout, notes = evaluate_layout_from_flags(args, workload, cluster, batch)
    except LayoutError as exc:
        if args.json:
            report.print_json_errors(workload, cluster, "evaluate", exc.problems, out)
        return fail(exc, ExitCode.INVALID, file=err)
    for note in notes:
        print(f"note: {note}", file=err)
    estimate = evaluate(workload, layout, cluster)
    better = better_split(workload, cluster, estimate)
    # The search over the same GPUs, model, batch and savers: is this the calculator's own choice?
    alternatives = search_like(workload, cluster, layout, sequence_parallel=args.sequence_parallel)
    best = alternatives.fitting[0] if alternatives.fitting else None
    slower = estimate.time.step_s / best.time.step_s - 1 if best is not None and estimate.fits else None
    if args.json:
        doc = report.json_header(workload, cluster, "evaluate") | {
            "layouts": [report.record(estimate, workload)],
            "errors": [],
        }
        doc["better_split"] = report.record(better, workload) if better else None
        doc["best_layout"] = report.record(best, workload) if best else None
        doc["slower_than_best"] = slower
        if args.compare_schedules:
            doc["schedules"] = [o.to_json() for o in compare_schedules(workload, estimate)]
        print(json.dumps(doc, indent=2), file=out)
    else:
        lines = report.describe_inputs(workload, cluster, layout.global_batch_size)
        zb = [zero_bubble_line(layout)] if workload.zero_bubble else []
        lines += ["", *layout.describe(), *zb, "", *report.table([estimate])]
        if estimate.tight and not args.explain:  # --explain says it in its memory part
            lines += [f"memory: {report.verdict_line(estimate)}"]
        if args.explain:
            lines += ["", *report.explain(estimate, workload)]
        if args.compare_schedules:
            lines += ["", *report.schedule_lines(estimate, workload)]
        lines += ["", *report.emit(estimate, workload)]
        if better is not None:
            gain = 1 - better.time.step_s / estimate.time.step_s
            lines += [
                "",
                f"an uneven split of the same factors is {gain:.1%} faster by this model (stage imbalance "
                f"{estimate.time.stage_imbalance:.1%} -> {better.time.stage_imbalance:.1%}):",
                *report.table([better]),
                *(report.stage_lines(better) if args.explain else []),
                *report.emit(better, workload)[:2],
            ]
        if slower is not None and best is not None:
            lines += ["", *report.against_best(slower, best, estimate)]
        print("\n".join(lines), file=out)
    if not estimate.fits:
        return fail(report.does_not_fit_message(estimate, workload, alternatives), ExitCode.DOES_NOT_FIT, file=err)
    return ExitCode.OK


def _relayout_mode(
    args: argparse.Namespace,
    workload: Workload,
    cluster: Cluster,
    batch: int | None,
    out: typing.TextIO,
    err: typing.TextIO,
) -> int:
    """The given layout, valid on ``--relayout-from-gpus`` GPUs, re-planned for the cluster's GPU count."""
    before = dataclasses.replace(cluster, gpus=args.relayout_from_gpus)
    try:
        if before.problems():
            raise LayoutToolError("--relayout-from-gpus: " + "; ".join(before.problems()))
        old, _ = evaluate_layout_from_flags(args, workload, before, batch)
        plan = relayout(
            workload,
            old,
            cluster,
            policy=args.relayout_policy or DEFAULT_POLICY,
            sequence_parallel=args.sequence_parallel,
        )
    except (LayoutError, LayoutToolError, RelayoutError) as exc:
        message = str(exc)
        if isinstance(exc, LayoutError):
            message = f"the layout as given does not run on --relayout-from-gpus {args.relayout_from_gpus}: {exc}"
        if args.json:
            report.print_json_errors(workload, cluster, "relayout", [message], out)
        return fail(message, ExitCode.DOES_NOT_FIT if isinstance(exc, RelayoutError) else ExitCode.INVALID, file=err)
    new = plan.new
    if args.json:
        doc = report.json_header(workload, cluster, "relayout") | {
            "relayout": plan.record(),
            "layouts": [report.record(new, workload)],
            "errors": [],
        }
        if args.compare_schedules:
            doc["schedules"] = [o.to_json() for o in compare_schedules(workload, new)]
        print(json.dumps(doc, indent=2), file=out)
        return ExitCode.OK
    sp = "on where TP > 1" if args.sequence_parallel else "off"
    lines = report.describe_inputs(workload, cluster, old.global_batch_size)
    lines += [
        "",
        f"relayout (policy {plan.policy}): {describe(old)} -> {describe(new.layout)}",
        "changed: " + ", ".join(plan.changes()),
        "kept: the model, the global batch of "
        f"{old.global_batch_size} sequences (the data order), sequence parallelism {sp}, distributed optimizer "
        f"{'on' if old.use_distributed_optimizer else 'off'}",
        "",
        *report.table([new]),
        *(["", *report.explain(new, workload)] if args.explain else []),
        *(["", *report.schedule_lines(new, workload)] if args.compare_schedules else []),
        "",
        *report.emit(new, workload),
    ]
    print("\n".join(lines), file=out)
    return ExitCode.OK


def _search_mode(
    args: argparse.Namespace,
    workload: Workload,
    cluster: Cluster,
    batch: int | None,
    out: typing.TextIO,
    err: typing.TextIO,
) -> int:
    if batch is None:
        source = f"--model {args.model} publishes no batch size; " if args.model is not None else ""
        return fail(
            f"{source}searching needs --global-batch-size (or a --model whose paper gives one)",
            ExitCode.INVALID,
            file=err,
        )
    found = search_with_savers(
        workload,
        cluster,
        global_batch_size=batch,
        sequence_parallel=args.sequence_parallel,
        use_distributed_optimizer=args.use_distributed_optimizer,
        micro_batch_size=args.micro_batch_size,
        uneven=not args.even_stages_only,
        # The placement switches given apply to every candidate (the factors that place layers evaluate instead).
        split={name: True for name in ACCOUNT_FOR if getattr(args, name)},
    )
    # The layouts and flags below are those of the search that found fitting layouts (savers included).
    result, workload = found.result, found.workload
    if not result.estimates:
        if args.json:
            report.print_json_errors(workload, cluster, "search", result.problems, out)
        return fail(
            f"no valid layout of {cluster.gpus} GPUs for this model and batch; the simplest candidate's "
            "problems:\n" + "\n".join(f"  - {p}" for p in result.problems),
            ExitCode.INVALID,
            file=err,
        )
    shown = result.estimates[: args.top]
    fitting = result.fitting
    if args.json:
        doc = report.json_header(workload, cluster, "search") | {
            "candidates": result.candidates,
            "valid_layouts": len(result.estimates),
            "fitting_layouts": len(fitting),
            "memory_savers_added": list(found.added),
            "memory_savers_tried": [list(t) for t in found.tried],
            "layouts": [report.record(e, workload) for e in shown],
            "errors": [],
        }
        if args.compare_schedules and fitting:
            doc["schedules"] = [o.to_json() for o in compare_schedules(workload, fitting[0])]
        print(json.dumps(doc, indent=2), file=out)
    else:
        lines = report.describe_inputs(workload, cluster, batch)
        restricted = " (micro-batch fixed)" if args.micro_batch_size is not None else ""
        if found.sequence_parallel:
            restricted += " (sequence parallel where TP > 1)"
        if found.tried:
            lines += ["", *report.saver_lines(found)]
        lines += [
            "",
            f"searched {result.candidates} candidates{restricted}: {len(result.estimates)} valid layouts, "
            f"{len(fitting)} fit in memory; "
            + (f"best {len(shown)} by estimated step time:" if fitting else "none fits; least memory first:"),
            *report.table(shown),
        ]
        best = shown[0]
        if args.explain:
            lines += ["", "best layout:", *report.explain(best, workload)]
        if args.compare_schedules and best.fits:
            lines += ["", *report.schedule_lines(best, workload)]
        if best.fits:
            lines += [""] + ([] if args.explain else ["best layout:"]) + report.emit(best, workload)
        print("\n".join(line for line in lines), file=out)
    if not fitting:
        best = result.estimates[0]
        searched = (
            f", even with {' '.join(found.added)} (searched)" if found.added else ", with every memory saver given"
        )
        return fail(
            f"none of the {len(result.estimates)} valid layouts fits in the {report.gib(cluster.gpu.memory_bytes)} "
            f"GiB of a GPU{searched}; the smallest needs {report.gib(best.memory.total_bytes)} GiB "
            f"({report.gib(-best.memory_margin_bytes)} GiB too much): use more GPUs "
            "(--gpus/--nodes) or a GPU with more memory",
            ExitCode.DOES_NOT_FIT,
            file=err,
        )
    return ExitCode.OK
