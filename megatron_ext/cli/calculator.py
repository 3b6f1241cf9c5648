"""Command line of ``tools/layout.py``: the 3D-parallel layout calculator.

Search mode (default) enumerates every valid TP × PP × VP × DP × micro-batch
layout for a GPU count and ranks those that fit in memory by estimated step
time. Evaluate mode (any of ``--tp/--pp/--vp`` or their ``pretrain_gpt.py``
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
from typing import Any

from megatron_ext.cli import calculator_report as report
from megatron_ext.cli import calibrate
from megatron_ext.config.arguments import BatchArgs, ConfigError, ModelArgs, OptimizerArgs, ParallelArgs
from megatron_ext.config.exit_codes import ExitCode
from megatron_ext.config.flags import Parser, add_options, options, value_type
from megatron_ext.config.layout_flags import (
    build_layout,
    megatron_lm_adjustments,
    pipeline_p2p_problems,
    zero_bubble_problems,
)
from megatron_ext.config.presets import PRESETS, get_preset
from megatron_ext.estimate.coverage import APPROXIMATED
from megatron_ext.estimate.hardware import PROFILES, get_profile
from megatron_ext.estimate.relayout import POLICIES, RelayoutError, describe, relayout
from megatron_ext.estimate.schedule_comparison import compare_schedules
from megatron_ext.estimate.search import (
    DEFAULT_MEMORY_HEADROOM,
    Cluster,
    better_split,
    evaluate,
    search_like,
    search_with_savers,
)
from megatron_ext.estimate.step_time import fp8_peak
from megatron_ext.estimate.workload import Workload
from megatron_ext.parallel.layout import LayoutError, ParallelLayout

DEFAULT_PROFILE = "h100-sxm"


class CalculatorError(ValueError):
    """Input the calculator cannot use; the message says what to give instead."""


def _add_modelled_flags(group: argparse._ArgumentGroup, cls: type) -> None:
    """``cls``'s pretrain_gpt.py flags that the calculator models (``estimate=True`` in the flag table), and those
    it approximates (``coverage.APPROXIMATED``: taken, said, and carried into the printed command)."""
    add_options(group, cls, options(cls, estimate=True), suppress_defaults=False, short_aliases=True)
    add_options(group, cls, approximated_fields(cls), suppress_defaults=False)


def approximated_fields(cls: type) -> list[Any]:
    """The flags of ``cls`` that the estimate approximates (``coverage.APPROXIMATED``)."""
    return [f for f in options(cls, estimate=False) if f.name in APPROXIMATED]


def _given(args: argparse.Namespace, fields: list[Any]) -> dict[str, Any]:
    """The values of ``fields`` given on the command line (not None, not a switch left off)."""
    values = {f.name: getattr(args, f.name) for f in fields}
    return {name: value for name, value in values.items() if value is not None and value is not False}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        unrecognized_hint=(
            "; the calculator takes the pretrain_gpt.py flags it models (shape, layout, batch, precision, "
            "recompute, overlap) or approximates (and says so), and no others: remove the rest from its command "
            "line (see --help)"
        ),
        prog="tools/layout.py",
        description=(
            "3D-parallel layout calculator for Megatron-Core GPT pretraining: enumerate, validate and rank "
            "TP × PP × VP × DP × micro-batch layouts by estimated memory and step time, or evaluate one. "
            "Exit codes: 0 fits, 2 invalid, 5 valid but does not fit."
        ),
        allow_abbrev=False,
    )
    cluster = parser.add_argument_group("cluster")
    size = cluster.add_mutually_exclusive_group()
    size.add_argument("--gpus", "--world-size", dest="gpus", type=int, help="Number of GPUs (world size).")
    size.add_argument("--nodes", type=int, help="Number of nodes (GPUs = nodes × --gpus-per-node).")
    cluster.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8).")
    cluster.add_argument(
        "--gpu",
        help=f"Hardware profile: {', '.join(PROFILES)} (default {DEFAULT_PROFILE}), or a profile file FILE.json "
        "that --calibrate wrote.",
    )
    cluster.add_argument("--peak-tflops", type=float, help="Override the profile's dense bf16/fp16 peak, TFLOP/s.")
    cluster.add_argument("--gpu-memory-gib", type=float, help="Override the profile's memory per GPU, GiB.")
    cluster.add_argument("--hbm-gbps", type=float, help="Override the profile's memory bandwidth, GB/s.")
    cluster.add_argument("--intra-node-gbps", type=float, help="Override the NVLink collective bandwidth, GB/s.")
    cluster.add_argument("--inter-node-gbps", type=float, help="Override the per-GPU network bandwidth, GB/s.")
    cluster.add_argument(
        "--compute-efficiency", type=float, help="Override the calibrated fraction of peak the GEMMs reach."
    )
    cluster.add_argument(
        "--attention-efficiency",
        type=float,
        help="A fixed share of peak for fused attention (in the kernels' causal count) instead of the published "
        "kernel benchmarks' curve by sequence length and head dimension.",
    )
    cluster.add_argument(
        "--memory-efficiency",
        type=float,
        help="Override the calibrated fraction of HBM bandwidth the element-wise kernels reach.",
    )
    cluster.add_argument(
        "--memory-headroom",
        type=float,
        default=DEFAULT_MEMORY_HEADROOM,
        help=f"Share of GPU memory kept free for CUDA context, NCCL, fragmentation (default {DEFAULT_MEMORY_HEADROOM}).",
    )

    model = parser.add_argument_group("model (pretrain_gpt.py flags)")
    model.add_argument("--model", help=f"Preset shape: {', '.join(PRESETS)}; the flags below override its values.")
    _add_modelled_flags(model, ModelArgs)
    model.add_argument(
        "--tokenizer-vocab-size",
        type=int,
        metavar="N",
        help="The tokenizer's vocabulary, which the run pads (default: --vocab-size + 1, the null tokenizer's "
        "end of document, as pretrain_gpt.py with mock data).",
    )

    layout = parser.add_argument_group(
        "layout (pretrain_gpt.py flags; giving TP, PP or VP evaluates that layout instead of searching)"
    )
    _add_modelled_flags(layout, ParallelArgs)
    batch = parser.add_argument_group("batch")
    _add_modelled_flags(batch, BatchArgs)
    training = parser.add_argument_group("precision and recomputation (default fp32, like pretrain_gpt.py)")
    _add_modelled_flags(training, OptimizerArgs)

    out = parser.add_argument_group("output")
    out.add_argument("--top", type=int, default=10, help="Layouts to list in search mode (default 10).")
    out.add_argument(
        "--even-stages-only",
        action="store_true",
        help="Search even stage splits only (by default uneven splits are ranked too, where they win).",
    )
    out.add_argument("--json", action="store_true", help="Print JSON instead of text.")
    out.add_argument("--explain", action="store_true", help="Break memory and time down (the chosen layout).")
    replan = parser.add_argument_group(
        "re-planning (a job that comes back on another GPU count: same model and global batch)"
    )
    replan.add_argument(
        "--relayout-from-gpus",
        type=int,
        metavar="N",
        help="The given layout ran on N GPUs: re-plan it for --gpus/--nodes and print what changes.",
    )
    replan.add_argument(
        "--relayout-policy",
        choices=POLICIES,
        default="any",
        help="any: the best layout for the new GPU count (default); dp: keep TP, CP, PP and VP, change DP only.",
    )
    out.add_argument(
        "--compare-schedules",
        action="store_true",
        help="Simulate the chosen layout's pipeline under GPipe (for comparison), 1F1B, interleaved 1F1B and "
        "interleaved 1F1B with the best microbatch group: bubble, exposed p2p, activations in flight, p2p "
        "volume and step time side by side.",
    )
    calibrate.add_arguments(parser)
    return parser


# ---------------------------------------------------------------- inputs
def _cluster(args: argparse.Namespace) -> Cluster:
    try:
        gpu = get_profile(args.gpu or DEFAULT_PROFILE)
    except ValueError as exc:
        raise CalculatorError(str(exc)) from None
    gpu = gpu.with_overrides(
        peak_tflops=args.peak_tflops,
        memory_gib=args.gpu_memory_gib,
        hbm_gbps=args.hbm_gbps,
        intra_node_gbps=args.intra_node_gbps,
        inter_node_gbps=args.inter_node_gbps,
        compute_efficiency=args.compute_efficiency,
        attention_efficiency=args.attention_efficiency,
        memory_efficiency=args.memory_efficiency,
    )
    if args.gpus is None and args.nodes is None:
        raise CalculatorError("give the GPU count: --gpus N (or --world-size N), or --nodes N")
    gpus = args.gpus if args.gpus is not None else args.nodes * args.gpus_per_node
    cluster = Cluster(gpus=gpus, gpus_per_node=args.gpus_per_node, gpu=gpu, memory_headroom=args.memory_headroom)
    problems = cluster.problems()
    if problems:
        raise CalculatorError("; ".join(problems))
    return cluster


def workload_of(args: argparse.Namespace) -> tuple[Workload, int | None]:
    """The model and training options, and the preset's global batch size (if a preset was given)."""
    values: dict[str, Any] = {}
    preset_batch = None
    if args.model is not None:
        try:
            preset = get_preset(args.model)
        except ValueError as exc:
            raise CalculatorError(str(exc)) from None
        values.update(preset.model_flags())
        preset_batch = preset.global_batch_size
    values.update(_given(args, [*options(ModelArgs, estimate=True), *approximated_fields(ModelArgs)]))
    missing = [
        f"--{n.replace('_', '-')}" for n in ("num_layers", "hidden_size", "num_attention_heads") if n not in values
    ]
    if missing:
        raise CalculatorError(f"give --model NAME or the model shape: {', '.join(missing)} missing")
    if "seq_length" not in values:
        raise CalculatorError("give --seq-length (tokens per sequence)")
    values.setdefault("vocab_size", 50257)
    # The training options as pretrain_gpt.py's groups take them, checked by the same rules.
    optim = _given(args, [*options(OptimizerArgs, estimate=True), *approximated_fields(OptimizerArgs)])
    try:
        workload = Workload.of_flags(
            ModelArgs(**values),
            OptimizerArgs(**optim),
            ParallelArgs(
                **_given(args, approximated_fields(ParallelArgs)),
                overlap_grad_reduce=args.overlap_grad_reduce,
                overlap_param_gather=args.overlap_param_gather,
                use_distributed_optimizer=args.use_distributed_optimizer,
                no_overlap_p2p_communication=args.no_overlap_p2p_communication,
                ddp_bucket_size=args.ddp_bucket_size,
                ddp_num_buckets=args.ddp_num_buckets,
                tp_comm_overlap=args.tp_comm_overlap,
                sequence_parallel=args.sequence_parallel,
                enable_zero_bubble=args.enable_zero_bubble,
            ),
            BatchArgs(**_given(args, approximated_fields(BatchArgs))),
            tokenizer_vocab_size=args.tokenizer_vocab_size,
        )
    except (ConfigError, ValueError) as exc:
        raise CalculatorError(str(exc)) from None
    return workload, preset_batch


def evaluate_layout_from_flags(
    args: argparse.Namespace, workload: Workload, cluster: Cluster, batch: int | None
) -> tuple[ParallelLayout, tuple[str, ...]]:
    """The layout of the given flags, built exactly as ``pretrain_gpt.py`` builds it (LayoutError if invalid),
    and the flags changed on the way as Megatron-LM changes them (each with why)."""
    given = {f.name: getattr(args, f.name) for f in options(ParallelArgs, estimate=True)}
    try:
        parallel = ParallelArgs(**{name: value for name, value in given.items() if value is not None})
    except ConfigError as exc:  # an out-of-range factor (--tp 0): the same one-line refusal as a broken rule
        raise LayoutError([str(exc)]) from None
    parallel, notes = megatron_lm_adjustments(parallel)
    batch_args = BatchArgs(micro_batch_size=args.micro_batch_size or 1, global_batch_size=batch)
    layout = build_layout(
        workload.model, parallel, batch_args, world_size=cluster.gpus, gpus_per_node=cluster.gpus_per_node
    )
    try:
        pipeline_p2p_problems(parallel, layout)
        # What pretrain_gpt.py refuses is not priced.
        zero_bubble_problems(parallel, layout, transformer_engine=workload.model.transformer_impl != "local")
    except ConfigError as exc:
        raise LayoutError([str(exc)]) from None
    return layout, notes


def main(
    argv: Sequence[str] | None = None, *, stdout: typing.TextIO | None = None, stderr: typing.TextIO | None = None
) -> int:
    """Parse, estimate, print; returns the exit code."""
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    args = build_parser().parse_args(argv)
    if args.calibrate is not None:
        return calibrate.run(args, out, err)
    try:
        if args.profile_out is not None or args.profile_name is not None:
            raise CalculatorError("--profile-out and --profile-name go with --calibrate METRICS [...]")
        cluster = _cluster(args)
        workload, preset_batch = workload_of(args)
        if workload.fp8_format:
            try:
                fp8_peak(workload, cluster.gpu)
            except ValueError as exc:
                raise CalculatorError(str(exc)) from None
        if args.top < 1:
            raise CalculatorError(f"--top must be at least 1, got {args.top}")
        batch = args.global_batch_size if args.global_batch_size is not None else preset_batch
        # The batch flags' own bounds, as pretrain_gpt.py checks them (the layout rules come later).
        BatchArgs(micro_batch_size=args.micro_batch_size or 1, global_batch_size=batch)
    except (CalculatorError, ConfigError) as exc:
        print(f"error: {exc}", file=err)
        return ExitCode.INVALID
    # A layout factor given (any non-switch parallel flag: TP, PP, VP, layers per virtual stage) evaluates it.
    factors = [f.name for f in options(ParallelArgs, estimate=True) if value_type(ParallelArgs, f.name)[0] is not bool]
    evaluate_mode = any(getattr(args, name) is not None for name in factors)
    if args.relayout_from_gpus is not None:
        return _relayout_mode(args, workload, cluster, batch, out, err)
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
        print(f"error: {exc}", file=err)
        if args.json:
            report.print_json_errors(workload, cluster, "evaluate", exc.problems, out)
        return ExitCode.INVALID
    for note in notes:
        print(f"note: {note}", file=err)
    estimate = evaluate(workload, layout, cluster)
    better = better_split(workload, cluster, estimate)
    # The search over the same GPUs, model, batch and savers: is this the calculator's own choice?
    alternatives = search_like(workload, cluster, layout)
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
        lines += ["", *layout.describe(), "", *report.table([estimate])]
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
            lines += ["", *report.against_best(slower, best)]
        print("\n".join(lines), file=out)
    if not estimate.fits:
        print(report.does_not_fit_message(estimate, workload, alternatives), file=err)
        return ExitCode.DOES_NOT_FIT
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
            raise CalculatorError("--relayout-from-gpus: " + "; ".join(before.problems()))
        old, _ = evaluate_layout_from_flags(args, workload, before, batch)
        plan = relayout(workload, old, cluster, policy=args.relayout_policy)
    except (LayoutError, CalculatorError, RelayoutError) as exc:
        message = str(exc)
        if isinstance(exc, LayoutError):
            message = f"the layout as given does not run on --relayout-from-gpus {args.relayout_from_gpus}: {exc}"
        print(f"error: {message}", file=err)
        if args.json:
            report.print_json_errors(workload, cluster, "relayout", [message], out)
        return ExitCode.DOES_NOT_FIT if isinstance(exc, RelayoutError) else ExitCode.INVALID
    new = plan.new
    if args.json:
        doc = report.json_header(workload, cluster, "relayout") | {
            "relayout": plan.record(),
            "layouts": [report.record(new, workload)],
            "errors": [],
        }
        print(json.dumps(doc, indent=2), file=out)
        return ExitCode.OK
    lines = report.describe_inputs(workload, cluster, old.global_batch_size)
    lines += [
        "",
        f"relayout (policy {plan.policy}): {describe(old)} -> {describe(new.layout)}",
        "changed: " + ", ".join(plan.changes()),
        "kept: the model, the global batch of "
        f"{old.global_batch_size} sequences (the data order), sequence parallelism "
        f"{'on' if old.sequence_parallel else 'off'}, distributed optimizer "
        f"{'on' if old.use_distributed_optimizer else 'off'}",
        "",
        *report.table([new]),
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
        print(f"error: {source}searching needs --global-batch-size (or a --model whose paper gives one)", file=err)
        return ExitCode.INVALID
    found = search_with_savers(
        workload,
        cluster,
        global_batch_size=batch,
        sequence_parallel=args.sequence_parallel,
        use_distributed_optimizer=args.use_distributed_optimizer,
        micro_batch_size=args.micro_batch_size,
        uneven=not args.even_stages_only,
    )
    # The layouts and flags below are those of the search that found fitting layouts (savers included).
    result, workload = found.result, found.workload
    if not result.estimates:
        print(
            f"error: no valid layout of {cluster.gpus} GPUs for this model and batch; the simplest candidate's "
            "problems:\n" + "\n".join(f"  - {p}" for p in result.problems),
            file=err,
        )
        if args.json:
            report.print_json_errors(workload, cluster, "search", result.problems, out)
        return ExitCode.INVALID
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
        print(
            f"error: none of the {len(result.estimates)} valid layouts fits in the {report.gib(cluster.gpu.memory_bytes)} "
            f"GiB of a GPU{searched}; the smallest needs {report.gib(best.memory.total_bytes)} GiB "
            f"({report.gib(-best.memory_margin_bytes)} GiB too much): use more GPUs "
            "(--gpus/--nodes) or a GPU with more memory",
            file=err,
        )
        return ExitCode.DOES_NOT_FIT
    return ExitCode.OK
