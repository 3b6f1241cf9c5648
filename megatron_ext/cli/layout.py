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

from megatron_ext.config.arguments import (
    BatchArgs,
    ConfigError,
    ModelArgs,
    OptimizerArgs,
    ParallelArgs,
    build_layout,
    megatron_lm_adjustments,
)
from megatron_ext.config.exit_codes import ExitCode
from megatron_ext.config.flags import Parser, add_options, options, value_type
from megatron_ext.config.layout import LayoutError, ParallelLayout
from megatron_ext.config.presets import PRESETS, get_preset
from megatron_ext.config.stages import rank_rows
from megatron_ext.estimate.hardware import GIB, PROFILES, get_profile
from megatron_ext.estimate.relayout import POLICIES, RelayoutError, describe, relayout
from megatron_ext.estimate.schedule_comparison import compare_schedules
from megatron_ext.estimate.search import (
    DEFAULT_MEMORY_HEADROOM,
    Cluster,
    LayoutEstimate,
    SaverSearch,
    SearchResult,
    better_split,
    evaluate,
    pretrain_flags,
    search_like,
    search_with_savers,
    slurm_counts,
)
from megatron_ext.estimate.workload import Workload


class CalculatorError(ValueError):
    """Input the calculator cannot use; the message says what to give instead."""


def _add_modelled_flags(group: argparse._ArgumentGroup, cls: type) -> None:
    """``cls``'s pretrain_gpt.py flags that the calculator models (``estimate=True`` in the flag table)."""
    add_options(group, cls, options(cls, estimate=True), suppress_defaults=False, short_aliases=True)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        unrecognized_hint=(
            "; the calculator takes the pretrain_gpt.py flags it models (shape, layout, batch, precision, "
            "recompute, overlap) and no others: remove the rest from its command line (see --help)"
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
        "--gpu", default="h100-sxm", help=f"Hardware profile: {', '.join(PROFILES)} (default h100-sxm)."
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
        help="Override the calibrated fraction of peak flash attention reaches (in Megatron's FLOP count).",
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
    return parser


# ---------------------------------------------------------------- inputs
def _cluster(args: argparse.Namespace) -> Cluster:
    try:
        gpu = get_profile(args.gpu)
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


def _workload(args: argparse.Namespace) -> tuple[Workload, int | None]:
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
    for name in (f.name for f in options(ModelArgs, estimate=True)):
        value = getattr(args, name)
        if value is not None and value is not False:
            values[name] = value
    missing = [
        f"--{n.replace('_', '-')}" for n in ("num_layers", "hidden_size", "num_attention_heads") if n not in values
    ]
    if missing:
        raise CalculatorError(f"give --model NAME or the model shape: {', '.join(missing)} missing")
    if "seq_length" not in values:
        raise CalculatorError("give --seq-length (tokens per sequence)")
    values.setdefault("vocab_size", 50257)
    if args.bf16 and args.fp16:
        raise CalculatorError("--bf16 and --fp16 are mutually exclusive; choose one")
    granularity = args.recompute_granularity or "none"
    if args.recompute_method is not None and granularity != "full":
        raise CalculatorError("--recompute-method is only used with --recompute-granularity full")
    if args.overlap_param_gather and not args.use_distributed_optimizer:
        raise CalculatorError("--overlap-param-gather needs --use-distributed-optimizer")
    try:
        model = ModelArgs(**values)
        workload = Workload(
            model=model,
            precision="bf16" if args.bf16 else "fp16" if args.fp16 else "fp32",
            recompute_granularity=granularity,
            recompute_method=args.recompute_method or "uniform",
            recompute_num_layers=args.recompute_num_layers or 1,
            overlap_grad_reduce=args.overlap_grad_reduce,
            overlap_param_gather=args.overlap_param_gather,
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
    return layout, notes


# ---------------------------------------------------------------- report
def _gib(value: float) -> str:
    return f"{value / GIB:.1f}"


def _describe_inputs(workload: Workload, cluster: Cluster, batch: int | None) -> list[str]:
    m, gpu = workload.model, cluster.gpu
    total = workload.parameter_counts(tp=1, pp=1).total
    shape = f"{m.num_layers} layers, hidden {m.hidden_size}, {m.num_attention_heads} heads"
    if m.group_query_attention:
        shape += f" ({m.num_query_groups} query groups)"
    peak = gpu.peak_flops if workload.mixed_precision else gpu.peak_flops_fp32
    lines = [
        f"model: {shape}, sequence {m.seq_length}, vocabulary {m.vocab_size}: {total / 1e9:.2f}B parameters",
        f"cluster: {cluster.gpus} × {gpu.name} ({cluster.nodes} node{'s' if cluster.nodes > 1 else ''} × "
        f"{min(cluster.gpus, cluster.gpus_per_node)}): {peak / 1e12:.0f} TFLOP/s {workload.precision} peak × "
        f"{gpu.compute_efficiency:.3f} for GEMMs"
        + (f" and {gpu.attention_efficiency:.3f} for flash attention" if gpu.attention_efficiency else "")
        + f", {_gib(gpu.memory_bytes)} GiB ({_gib(cluster.usable_memory_bytes)} "
        f"usable), NVLink {gpu.intra_node_bandwidth / 1e9:.0f} GB/s, network {gpu.inter_node_bandwidth / 1e9:.0f} GB/s per GPU",
    ]
    options = [workload.precision if workload.mixed_precision else "fp32 (no --bf16/--fp16)"]
    options.append(f"recompute {workload.recompute_granularity}")
    if workload.recompute_granularity == "full":
        options[-1] += f" ({workload.recompute_method}, {workload.recompute_num_layers} layer(s))"
    options += [name for name in ("overlap_grad_reduce", "overlap_param_gather") if getattr(workload, name)]
    if batch is not None:
        options.append(f"global batch {batch} sequences ({batch * m.seq_length:,} tokens)")
    lines.append("training: " + ", ".join(o.replace("_", "-") for o in options))
    return lines


def _table(estimates: list[LayoutEstimate]) -> list[str]:
    # A CP column only where context parallelism was asked for (the search keeps CP 1).
    with_cp = any(e.layout.cp > 1 for e in estimates)
    header = (
        (f"{'TP':>3} {'CP':>3} " if with_cp else f"{'TP':>3} ")
        + f"{'PP':>3} {'VP':>3} {'DP':>5} {'MB':>3} {'#mb':>5} {'GiB/GPU':>8} {'fits':>4} "
        f"{'bubble':>7} {'step s':>9} {'tokens/s':>11} {'TFLOP/s':>8} {'MFU':>6} {'imbal':>6}  split"
    )
    rows = [header]
    for e in estimates:
        lay = e.layout
        factors = f"{lay.tp:>3} {lay.cp:>3} " if with_cp else f"{lay.tp:>3} "
        rows.append(
            f"{factors}{lay.pp:>3} {lay.vp:>3} {lay.dp:>5} {lay.micro_batch_size:>3} {lay.num_microbatches:>5} "
            f"{_gib(e.memory.total_bytes):>8} {'yes' if e.fits else 'NO':>4} "
            f"{lay.bubble_fraction:>7.1%} {e.time.step_s:>9.3f} "
            f"{e.tokens_per_sec:>11,.0f} {e.tflops_per_gpu:>8.1f} {e.mfu:>6.1%} {e.time.stage_imbalance:>6.1%}  "
            f"{SPLIT_NAMES[lay.split.mode]}"
        )
    return rows


SPLIT_NAMES = {"uniform": "even", "first/last": "first/last", "account": "account-for", "layout": "layout string"}
"""The table's name of each way of placing layers (``config/stages.py``)."""


def _stage_lines(e: LayoutEstimate) -> list[str]:
    """Per pipeline stage: what it holds, its time per microbatch and its memory; alike ranks share a row."""
    lay, t, mem = e.layout, e.time, e.memory
    texts = [
        f"{' | '.join(c.summary() for c in lay.stages[r]):<20} {t.stage_microbatch_s[r] * 1e3:>9.2f} ms "
        f"{_gib(mem.stages[r].total_bytes):>7} GiB"
        for r in range(lay.pp)
    ]
    lines = [f"pipeline stages ({SPLIT_NAMES[lay.split.mode]} split; forward+backward per microbatch, memory per GPU):"]
    lines += [f"  {label:<12} {text}" for label, _, _, text in rank_rows(texts)]
    lines.append(
        f"  predicted stage imbalance {t.stage_imbalance:.1%} (slowest: rank {t.slowest_stage}; "
        "the slowest stage sets the pace)"
    )
    return lines


def _explain(e: LayoutEstimate, workload: Workload) -> list[str]:
    lay, mem, t, cluster = e.layout, e.memory, e.time, e.cluster
    most = mem.most_loaded
    per_w = most.weights_bytes / most.parameters
    per_o = most.optimizer_bytes / most.parameters
    shards, over = lay.dp * lay.cp, f"DP {lay.dp} × CP {lay.cp}" if lay.cp > 1 else f"DP {lay.dp}"
    opt_note = f"{per_o:.2f} bytes/param" + (
        f" = {per_o * shards:.0f} / {over}, distributed optimizer" if lay.use_distributed_optimizer else ""
    )
    other = mem.last if most is mem.first else mem.first
    lines = [
        f"memory on the most loaded GPU ({most.stage} pipeline stage):",
        f"  parameters          {most.parameters:>16,}",
        f"  weights             {_gib(most.weights_bytes):>12} GiB  ({per_w:.0f} bytes/param)",
        f"  gradients           {_gib(most.gradients_bytes):>12} GiB  (4 bytes/param, fp32)",
        f"  optimizer states    {_gib(most.optimizer_bytes):>12} GiB  ({opt_note})",
        f"  activations         {_gib(most.activations_bytes):>12} GiB  ({mem.layer_activation_bytes / 2**20:.1f} MiB "
        f"per layer and microbatch, {lay.layers_per_pipeline_stage} layers, {most.in_flight_microbatches:.2f} "
        f"microbatches in flight, recompute {workload.recompute_granularity})",
        f"  total               {_gib(most.total_bytes):>12} GiB  of {_gib(cluster.usable_memory_bytes)} usable "
        f"({_gib(cluster.gpu.memory_bytes)} GiB × {1 - cluster.memory_headroom:.2f})",
    ]
    if other is not most:
        lines.append(f"  ({other.stage} stage: {_gib(other.total_bytes)} GiB)")
    if lay.pp > 1:
        lines += _stage_lines(e)
    lines += [
        f"step time {t.step_s:.3f} s:",
        f"  compute             {t.compute_s:>10.3f} s  ({lay.num_microbatches} microbatches × "
        f"{t.microbatch_compute_s * 1e3:.2f} ms on the slowest stage)",
        f"  tensor-parallel     {t.tp_comm_s:>10.3f} s  (all-reduce / all-gather + reduce-scatter, NVLink)",
        *(
            [f"  context-parallel    {t.cp_comm_s:>10.3f} s  (key/value ring exchange not hidden by attention)"]
            if lay.cp > 1
            else []
        ),
        f"  pipeline bubble     {t.bubble_s:>10.3f} s  (fill and drain through the other stages; "
        f"(p-1)/(v*m) = {lay.pp - 1}/({lay.vp}*{lay.num_microbatches}) = {lay.bubble_fraction:.2%} with even stages; "
        f"{t.bubble_share:.2%} of the step)",
        f"  pipeline p2p        {t.pp_comm_s:>10.3f} s  (exposed)",
        f"  data-parallel       {t.dp_comm_s:>10.3f} s  (exposed, of {t.dp_comm_total_s:.3f} s)",
        f"  optimizer step      {t.optimizer_s:>10.3f} s",
        f"throughput: {e.tokens_per_sec:,.0f} tokens/s, {e.tflops_per_gpu:.1f} model TFLOP/s per GPU "
        f"({e.hardware_tflops_per_gpu:.1f} with recomputation), MFU {e.mfu:.1%}",
    ]
    return lines


def _emit(e: LayoutEstimate, workload: Workload) -> list[str]:
    counts = slurm_counts(e.cluster)
    return [
        "pretrain_gpt.py flags:",
        "  " + " \\\n  ".join(pretrain_flags(workload, e.layout)),
        f"SLURM: #SBATCH --nodes={counts['nodes']} --gpus-per-node={counts['gpus_per_node']}  "
        f"(torchrun per node: --ntasks-per-node={counts['ntasks_per_node_torchrun']}; "
        f"srun per GPU: --ntasks-per-node={counts['ntasks_per_node_srun']}); world size {counts['world_size']}",
    ]


def _record(e: LayoutEstimate, workload: Workload) -> dict[str, Any]:
    record = e.to_json()
    record["pretrain_flags"] = " ".join(pretrain_flags(workload, e.layout))
    return record


def _json_header(workload: Workload, cluster: Cluster, mode: str) -> dict[str, Any]:
    gpu = cluster.gpu
    return {
        "mode": mode,
        "gpu": {
            "name": gpu.name,
            "peak_tflops": (gpu.peak_flops if workload.mixed_precision else gpu.peak_flops_fp32) / 1e12,
            "memory_bytes": gpu.memory_bytes,
            "compute_efficiency": gpu.compute_efficiency,
            "attention_efficiency": gpu.attention_efficiency,
            "memory_efficiency": gpu.memory_efficiency,
        },
        "cluster": slurm_counts(cluster),
        "precision": workload.precision,
        "recompute_granularity": workload.recompute_granularity,
    }


def _print_json_errors(workload: Workload, cluster: Cluster, mode: str, errors: list[str], out: typing.TextIO) -> None:
    """The JSON document of a run that produced no layout: the header and why."""
    print(json.dumps(_json_header(workload, cluster, mode) | {"layouts": [], "errors": errors}), file=out)


def _does_not_fit_message(e: LayoutEstimate, workload: Workload, alternatives: SearchResult | None) -> str:
    cluster = e.cluster
    over = e.memory.total_bytes - cluster.usable_memory_bytes
    lines = [
        f"error: the layout is valid but needs an estimated {_gib(e.memory.total_bytes)} GiB per GPU "
        f"({e.memory.most_loaded.stage} pipeline stage), {_gib(over)} GiB more than the "
        f"{_gib(cluster.usable_memory_bytes)} GiB usable on {cluster.gpu.name} "
        f"({_gib(cluster.gpu.memory_bytes)} GiB, {cluster.memory_headroom:.0%} headroom)"
    ]
    tips = []
    for label, change in _memory_savers(e, workload):
        tips.append(f"  - {label}: {_gib(change.memory.total_bytes)} GiB{'' if change.fits else ' (still too much)'}")
    if alternatives is not None and alternatives.fitting:
        best = alternatives.fitting[0]
        lay = best.layout
        tips.append(
            f"  - or the calculator's best layout for {cluster.gpus} GPUs: TP {lay.tp} PP {lay.pp} VP {lay.vp} "
            f"DP {lay.dp} micro-batch {lay.micro_batch_size}: {_gib(best.memory.total_bytes)} GiB, "
            f"{best.time.step_s:.2f} s/step (run without --tp/--pp/--vp to see the ranking)"
        )
    if tips:
        lines.append("what would change it (same GPUs):")
        lines += tips
    else:
        lines.append("nothing simple fits on these GPUs: use more GPUs (--gpus/--nodes) or a GPU with more memory")
    return "\n".join(lines)


def _memory_savers(e: LayoutEstimate, workload: Workload) -> list[tuple[str, LayoutEstimate]]:
    """The same layout with one memory-saving change each, that are valid."""
    lay, out = e.layout, []
    variants: list[tuple[str, Workload, dict[str, Any]]] = []
    if not lay.use_distributed_optimizer and lay.dp > 1:
        variants.append(("--use-distributed-optimizer", workload, {"use_distributed_optimizer": True}))
    if lay.tp > 1 and not lay.sequence_parallel:
        variants.append(("--sequence-parallel", workload, {"sequence_parallel": True}))
    if workload.recompute_granularity == "none":
        variants.append(
            ("--recompute-granularity selective", dataclasses.replace(workload, recompute_granularity="selective"), {})
        )
    if workload.recompute_granularity != "full":
        variants.append(
            (
                "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1",
                dataclasses.replace(workload, recompute_granularity="full"),
                {},
            )
        )
    if lay.micro_batch_size > 1:
        variants.append(("--micro-batch-size 1", workload, {"micro_batch_size": 1}))
    for label, w, change in variants:
        values = {f.name: getattr(lay, f.name) for f in dataclasses.fields(lay)} | change
        candidate, problems = ParallelLayout.check(**values)
        if not problems:
            out.append((label, evaluate(w, candidate, e.cluster)))
    return out


# ---------------------------------------------------------------- main
def main(
    argv: Sequence[str] | None = None, *, stdout: typing.TextIO | None = None, stderr: typing.TextIO | None = None
) -> int:
    """Parse, estimate, print; returns the exit code."""
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    args = build_parser().parse_args(argv)
    try:
        cluster = _cluster(args)
        workload, preset_batch = _workload(args)
        if args.top < 1:
            raise CalculatorError(f"--top must be at least 1, got {args.top}")
    except CalculatorError as exc:
        print(f"error: {exc}", file=err)
        return ExitCode.INVALID
    batch = args.global_batch_size if args.global_batch_size is not None else preset_batch
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
            _print_json_errors(workload, cluster, "evaluate", exc.problems, out)
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
        doc = _json_header(workload, cluster, "evaluate") | {"layouts": [_record(estimate, workload)], "errors": []}
        doc["better_split"] = _record(better, workload) if better else None
        doc["best_layout"] = _record(best, workload) if best else None
        doc["slower_than_best"] = slower
        if args.compare_schedules:
            doc["schedules"] = [o.to_json() for o in compare_schedules(workload, estimate)]
        print(json.dumps(doc, indent=2), file=out)
    else:
        lines = _describe_inputs(workload, cluster, layout.global_batch_size)
        lines += ["", *layout.describe(), "", *_table([estimate])]
        if args.explain:
            lines += ["", *_explain(estimate, workload)]
        if args.compare_schedules:
            lines += ["", *_schedule_lines(estimate, workload)]
        lines += ["", *_emit(estimate, workload)]
        if better is not None:
            gain = 1 - better.time.step_s / estimate.time.step_s
            lines += [
                "",
                f"an uneven split of the same factors is {gain:.1%} faster by this model (stage imbalance "
                f"{estimate.time.stage_imbalance:.1%} -> {better.time.stage_imbalance:.1%}):",
                *_table([better]),
                *(_stage_lines(better) if args.explain else []),
                *_emit(better, workload)[:2],
            ]
        if slower is not None and best is not None:
            lines += ["", *_against_best(slower, best)]
        print("\n".join(lines), file=out)
    if not estimate.fits:
        print(_does_not_fit_message(estimate, workload, alternatives), file=err)
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
            _print_json_errors(workload, cluster, "relayout", [message], out)
        return ExitCode.DOES_NOT_FIT if isinstance(exc, RelayoutError) else ExitCode.INVALID
    new = plan.new
    if args.json:
        doc = _json_header(workload, cluster, "relayout") | {
            "relayout": plan.record(),
            "layouts": [_record(new, workload)],
            "errors": [],
        }
        print(json.dumps(doc, indent=2), file=out)
        return ExitCode.OK
    lines = _describe_inputs(workload, cluster, old.global_batch_size)
    lines += [
        "",
        f"relayout (policy {plan.policy}): {describe(old)} -> {describe(new.layout)}",
        "changed: " + ", ".join(plan.changes()),
        "kept: the model, the global batch of "
        f"{old.global_batch_size} sequences (the data order), sequence parallelism "
        f"{'on' if old.sequence_parallel else 'off'}, distributed optimizer "
        f"{'on' if old.use_distributed_optimizer else 'off'}",
        "",
        *_table([new]),
        "",
        *_emit(new, workload),
    ]
    print("\n".join(lines), file=out)
    return ExitCode.OK


AS_GOOD_AS_BEST = 0.005
"""Within this much of the search's best step time, a layout counts as the calculator's choice (0.5%)."""


def _against_best(slower: float, best: LayoutEstimate) -> list[str]:
    """How the evaluated layout compares with the search's best for the same GPUs, model, batch and savers."""
    if slower <= AS_GOOD_AS_BEST:
        return [f"calculator's best: this layout (or within {AS_GOOD_AS_BEST:.1%} of it) for these GPUs and flags"]
    lay = best.layout
    return [
        f"calculator's best for these GPUs and flags: TP {lay.tp} PP {lay.pp} VP {lay.vp} DP {lay.dp} "
        f"micro-batch {lay.micro_batch_size}: {best.time.step_s:.3f} s/step, MFU {best.mfu:.1%}, "
        f"{_gib(best.memory.total_bytes)} GiB; this layout is {slower:.1%} slower by this model "
        "(run without --tp/--pp/--vp for the ranking)"
    ]


def _search_mode(
    args: argparse.Namespace,
    workload: Workload,
    cluster: Cluster,
    batch: int | None,
    out: typing.TextIO,
    err: typing.TextIO,
) -> int:
    if batch is None:
        print("error: searching needs --global-batch-size (or --model NAME, whose paper's batch is used)", file=err)
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
            _print_json_errors(workload, cluster, "search", result.problems, out)
        return ExitCode.INVALID
    shown = result.estimates[: args.top]
    fitting = result.fitting
    if args.json:
        doc = _json_header(workload, cluster, "search") | {
            "candidates": result.candidates,
            "valid_layouts": len(result.estimates),
            "fitting_layouts": len(fitting),
            "memory_savers_added": list(found.added),
            "memory_savers_tried": [list(t) for t in found.tried],
            "layouts": [_record(e, workload) for e in shown],
            "errors": [],
        }
        if args.compare_schedules and fitting:
            doc["schedules"] = [o.to_json() for o in compare_schedules(workload, fitting[0])]
        print(json.dumps(doc, indent=2), file=out)
    else:
        lines = _describe_inputs(workload, cluster, batch)
        restricted = " (micro-batch fixed)" if args.micro_batch_size is not None else ""
        if found.sequence_parallel:
            restricted += " (sequence parallel where TP > 1)"
        if found.tried:
            lines += ["", *_saver_lines(found)]
        lines += [
            "",
            f"searched {result.candidates} candidates{restricted}: {len(result.estimates)} valid layouts, "
            f"{len(fitting)} fit in memory; "
            + (f"best {len(shown)} by estimated step time:" if fitting else "none fits; least memory first:"),
            *_table(shown),
        ]
        best = shown[0]
        if args.explain:
            lines += ["", "best layout:", *_explain(best, workload)]
        if args.compare_schedules and best.fits:
            lines += ["", *_schedule_lines(best, workload)]
        if best.fits:
            lines += [""] + ([] if args.explain else ["best layout:"]) + _emit(best, workload)
        print("\n".join(line for line in lines), file=out)
    if not fitting:
        best = result.estimates[0]
        searched = (
            f", even with {' '.join(found.added)} (searched)" if found.added else ", with every memory saver given"
        )
        print(
            f"error: none of the {len(result.estimates)} valid layouts fits in {_gib(cluster.usable_memory_bytes)} GiB "
            f"per GPU{searched}; the smallest needs {_gib(best.memory.total_bytes)} GiB "
            f"({_gib(best.memory.total_bytes - cluster.usable_memory_bytes)} GiB too much): use more GPUs "
            "(--gpus/--nodes) or a GPU with more memory",
            file=err,
        )
        return ExitCode.DOES_NOT_FIT
    return ExitCode.OK


def _relative(value: float, reference: float) -> float:
    """``value`` over ``reference``, minus 1; 0 below a twentieth of a percent (no "-0.0%")."""
    change = value / reference - 1
    return 0.0 if abs(change) < 5e-4 else change


def _schedule_lines(e: LayoutEstimate, workload: Workload) -> list[str]:
    """The layout's pipeline under every schedule, as a table (``schedule_comparison.py``)."""
    lay = e.layout
    options = compare_schedules(workload, e)
    if not options:
        return ["schedules: PP = 1, no pipeline: every schedule runs the same"]
    lines = [
        f"pipeline schedules for TP {lay.tp} PP {lay.pp} DP {lay.dp}, {lay.num_microbatches} microbatches, "
        "simulated pass by pass (GPipe is not a Megatron-Core schedule: shown for comparison only):",
        f" {'schedule':<46} {'bubble':>7} {'p2p s':>7} {'in flight':>9} {'act GiB':>8} {'peak GiB':>9} {'fits':>4} "
        f"{'p2p GB':>8} {'step s':>9} {'vs this':>8}",
    ]
    for o in options:
        if o.run is None:
            lines.append(f" {o.label:<46} not possible: {o.reason}")
            continue
        lines.append(
            f" {o.label:<46} {o.run.bubble_share:>7.2%} {o.run.p2p_exposed:>7.3f} "
            f"{max(o.run.in_flight_microbatches):>9.1f} {_gib(max(o.activation_bytes)):>8} {_gib(o.peak_bytes):>9} "
            f"{'yes' if o.fits else 'no':>4} {o.p2p_bytes / 1e9:>8.2f} {o.step_s:>9.3f} "
            f"{_relative(o.step_s, e.time.step_s):>+8.1%}"
        )
    lines += [
        "bubble: idle share of the step with free transfers; p2p s: what the transfers add; in flight: most "
        "microbatches' activations a stage holds (GPipe all m, 1F1B at most PP); act GiB: those activations on "
        "the most loaded stage; p2p GB: what the busiest rank sends per step; vs this: against the closed-form "
        f"estimate above ({e.time.step_s:.3f} s)",
    ]
    return lines


def _saver_lines(found: SaverSearch) -> list[str]:
    """What the search had to turn on, and what it tried first."""
    lines = ["nothing fits with the flags as given; searched again with memory savers, cheapest first:"]
    for flags in found.tried:
        mark = "<- kept" if flags == found.added and found.result.fitting else ""
        lines.append(f"  + {' '.join(flags)} {mark}".rstrip())
    if found.result.fitting:
        lines.append(f"the layouts below need {' '.join(found.added)} (in the emitted flags)")
    return lines
