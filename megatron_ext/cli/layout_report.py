"""What the layout calculator (``megatron_ext.cli.layout``) prints: the inputs, the table of layouts,
one layout explained (memory, time, stages, the schedules compared), and why a layout does not fit with what
would make it fit. Text and JSON; nothing here decides anything."""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any

from megatron_ext.estimate.hardware import GIB
from megatron_ext.estimate.schedule_comparison import compare_schedules
from megatron_ext.estimate.search import (
    Cluster,
    LayoutEstimate,
    SaverSearch,
    SearchResult,
    evaluate,
    pretrain_flags,
    scheduled,
    slurm_counts,
)
from megatron_ext.estimate.workload import Workload
from megatron_ext.parallel.layout import ParallelLayout
from megatron_ext.parallel.stages import rank_rows


def gib(value: float) -> str:
    return f"{value / GIB:.1f}"


def describe_inputs(workload: Workload, cluster: Cluster, batch: int | None) -> list[str]:
    m, gpu = workload.model, cluster.gpu
    total = workload.parameter_counts(tp=1, pp=1).total
    shape = f"{m.num_layers} layers, hidden {m.hidden_size}, {m.num_attention_heads} heads"
    if m.group_query_attention:
        shape += f" ({m.num_query_groups} query groups)"
    peak = gpu.peak_flops if workload.mixed_precision else gpu.peak_flops_fp32
    vocab = (
        f"vocabulary {m.vocab_size}"
        if workload.tokenizer_vocab_size is None
        else f"the tokenizer's vocabulary of {workload.tokenizer_vocab_size}"
    )
    lines = [
        f"model: {shape}, sequence {m.seq_length}, {vocab}: {total / 1e9:.2f}B parameters",
        f"cluster: {cluster.gpus} × {gpu.name} ({cluster.nodes} node{'s' if cluster.nodes > 1 else ''} × "
        f"{min(cluster.gpus, cluster.gpus_per_node)}): {peak / 1e12:.0f} TFLOP/s {workload.precision} peak × "
        f"{gpu.compute_efficiency:.3f} for GEMMs"
        + (
            f" (FP8: {gpu.peak_flops_fp8 / 1e12:.0f} TFLOP/s peak)"
            if workload.fp8_format and gpu.peak_flops_fp8
            else ""
        )
        + (
            f" and {gpu.attention_efficiency:.3f} for fused attention"
            if gpu.attention_efficiency
            else " (fused attention by the kernel benchmarks' curve)"
        )
        + f", {gib(gpu.memory_bytes)} GiB ({gib(cluster.usable_memory_bytes)} "
        f"usable), NVLink {gpu.intra_node_bandwidth / 1e9:.0f} GB/s, network {gpu.inter_node_bandwidth / 1e9:.0f} GB/s per GPU",
    ]
    options = [workload.precision if workload.mixed_precision else "fp32 (no --bf16/--fp16)"]
    if workload.fp8_format:
        options.append(
            f"FP8 GEMMs ({workload.fp8_format}, {workload.fp8_recipe} scaling; MFU counts the {workload.precision} "
            "peak)"
        )
    options.append(f"recompute {workload.recompute_granularity}")
    if workload.recompute_granularity == "full":
        options[-1] += f" ({workload.recompute_method}, {workload.recompute_num_layers} layer(s))"
    options += [
        name
        for name in ("overlap_grad_reduce", "overlap_param_gather", "grad_reduce_in_bf16")
        if getattr(workload, name)
    ]
    if batch is not None:
        options.append(f"global batch {batch} sequences ({batch * m.seq_length:,} tokens)")
    lines.append("training: " + ", ".join(o.replace("_", "-") for o in options))
    lines += [f"approximated: {note}" for note in workload.approximations]
    return lines


def table(estimates: list[LayoutEstimate]) -> list[str]:
    # A CP column only where context parallelism was asked for (the search keeps CP 1).
    with_cp = any(e.layout.cp > 1 for e in estimates)
    header = (
        (f"{'TP':>3} {'CP':>3} " if with_cp else f"{'TP':>3} ")
        + f"{'PP':>3} {'VP':>3} {'DP':>5} {'MB':>3} {'#mb':>5} {'GiB/GPU':>8} {'fits':>5} "
        f"{'bubble':>7} {'step s':>9} {'tokens/s':>11} {'TFLOP/s':>8} {'MFU':>6} {'imbal':>6}  split"
    )
    rows = [header]
    for e in estimates:
        lay = e.layout
        factors = f"{lay.tp:>3} {lay.cp:>3} " if with_cp else f"{lay.tp:>3} "
        rows.append(
            f"{factors}{lay.pp:>3} {lay.vp:>3} {lay.dp:>5} {lay.micro_batch_size:>3} {lay.num_microbatches:>5} "
            f"{gib(e.memory.total_bytes):>8} {FITS_COLUMN[e.verdict]:>5} "
            f"{lay.bubble_fraction * e.time.bubble_scale:>7.1%} {e.time.step_s:>9.3f} "
            f"{e.tokens_per_sec:>11,.0f} {e.tflops_per_gpu:>8.1f} {e.mfu:>6.1%} {e.time.stage_imbalance:>6.1%}  "
            f"{SPLIT_NAMES[lay.split.mode]}{', zero-bubble' if e.zero_bubble else ''}"
        )
    return rows


FITS_COLUMN = {"fits": "yes", "tight": "tight", "does not fit": "NO"}
"""The table's word for each memory verdict."""

SPLIT_NAMES = {"uniform": "even", "first/last": "first/last", "account": "account-for", "layout": "layout string"}
"""The table's name of each way of placing layers (``parallel/stages.py``)."""


def stage_lines(e: LayoutEstimate) -> list[str]:
    """Per pipeline stage: what it holds, its time per microbatch and its memory; alike ranks share a row."""
    lay, t, mem = e.layout, e.time, e.memory
    texts = [
        f"{' | '.join(c.summary() for c in lay.stages[r]):<20} {t.stage_microbatch_s[r] * 1e3:>9.2f} ms "
        f"{gib(mem.stages[r].total_bytes):>7} GiB"
        for r in range(lay.pp)
    ]
    lines = [f"pipeline stages ({SPLIT_NAMES[lay.split.mode]} split; forward+backward per microbatch, memory per GPU):"]
    lines += [f"  {label:<12} {text}" for label, _, _, text in rank_rows(texts)]
    lines.append(
        f"  predicted stage imbalance {t.stage_imbalance:.1%} (slowest: rank {t.slowest_stage}; "
        "the slowest stage sets the pace)"
    )
    return lines


def explain(e: LayoutEstimate, workload: Workload) -> list[str]:
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
        f"  weights             {gib(most.weights_bytes):>12} GiB  ({per_w:.0f} bytes/param)",
        f"  gradients           {gib(most.gradients_bytes):>12} GiB  ({workload.gradient_bytes:.0f} bytes/param, "
        f"{'bf16' if workload.grad_reduce_in_bf16 else 'fp32'})",
        f"  optimizer states    {gib(most.optimizer_bytes):>12} GiB  ({opt_note})",
        f"  activations         {gib(most.activations_bytes):>12} GiB  ({mem.layer_activation_bytes / 2**20:.1f} MiB "
        f"per layer and microbatch, {lay.layers_per_pipeline_stage} layers, {most.in_flight_microbatches:.2f} "
        f"microbatches in flight, recompute {workload.recompute_granularity})",
        f"  total               {gib(most.total_bytes):>12} GiB  of {gib(cluster.gpu.memory_bytes)} GiB: "
        f"{verdict_line(e)}",
    ]
    if other is not most:
        lines.append(f"  ({other.stage} stage: {gib(other.total_bytes)} GiB)")
    if lay.pp > 1:
        lines += stage_lines(e)
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
        f"  optimizer step      {t.optimizer_s:>10.3f} s  (Adam, gradient norm and clipping, the norm's all-reduce)",
        f"  step bookkeeping    {t.housekeeping_s:>10.3f} s  (zeroing the gradient buffer, the loss's all-reduces)",
        f"throughput: {e.tokens_per_sec:,.0f} tokens/s, {e.tflops_per_gpu:.1f} model TFLOP/s per GPU "
        f"({e.hardware_tflops_per_gpu:.1f} with recomputation), MFU {e.mfu:.1%}",
    ]
    return lines


def emit(e: LayoutEstimate, workload: Workload) -> list[str]:
    counts = slurm_counts(e.cluster)
    return [
        "pretrain_gpt.py flags:",
        "  " + " \\\n  ".join(pretrain_flags(scheduled(workload, e), e.layout)),
        f"SLURM: #SBATCH --nodes={counts['nodes']} --gpus-per-node={counts['gpus_per_node']}  "
        f"(torchrun per node: --ntasks-per-node={counts['ntasks_per_node_torchrun']}; "
        f"srun per GPU: --ntasks-per-node={counts['ntasks_per_node_srun']}); world size {counts['world_size']}",
    ]


def record(e: LayoutEstimate, workload: Workload) -> dict[str, Any]:
    record = e.to_json()
    record["pretrain_flags"] = " ".join(pretrain_flags(scheduled(workload, e), e.layout))
    return record


def json_header(workload: Workload, cluster: Cluster, mode: str) -> dict[str, Any]:
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
        "approximations": list(workload.approximations),
    }


def print_json_errors(workload: Workload, cluster: Cluster, mode: str, errors: list[str], out: typing.TextIO) -> None:
    """The JSON document of a run that produced no layout: the header and why."""
    print(json.dumps(json_header(workload, cluster, mode) | {"layouts": [], "errors": errors}), file=out)


def verdict_line(e: LayoutEstimate) -> str:
    """The memory verdict with its margin, in words."""
    cluster, margin = e.cluster, e.memory_margin_bytes
    reserve = f"the {cluster.memory_headroom:.0%} ({gib(cluster.gpu.memory_bytes - cluster.usable_memory_bytes)} GiB)"
    if e.verdict == "fits":
        return f"fits, {gib(margin)} GiB to spare ({reserve} reserved for what the estimate does not count included)"
    if e.verdict == "tight":
        return (
            f"tight, {gib(margin)} GiB to spare: within {reserve} reserved for what the estimate does not count "
            "(CUDA context, NCCL buffers, fragmentation); it may run — watch the first steps' memory"
        )
    return f"does not fit, {gib(-margin)} GiB over the card's capacity"


def does_not_fit_message(e: LayoutEstimate, workload: Workload, alternatives: SearchResult | None) -> str:
    """Why a valid layout does not fit, and what would make it fit on the same GPUs (the lines after an
    ``error:`` prefix)."""
    cluster = e.cluster
    over = -e.memory_margin_bytes
    lines = [
        f"the layout is valid but needs an estimated {gib(e.memory.total_bytes)} GiB per GPU "
        f"({e.memory.most_loaded.stage} pipeline stage), {gib(over)} GiB more than the "
        f"{gib(cluster.gpu.memory_bytes)} GiB of {cluster.gpu.name}"
    ]
    tips = []
    for label, change in memory_savers(e, workload):
        tips.append(f"  - {label}: {gib(change.memory.total_bytes)} GiB{'' if change.fits else ' (still too much)'}")
    if alternatives is not None and alternatives.fitting:
        best = alternatives.fitting[0]
        lay = best.layout
        tips.append(
            f"  - or the calculator's best layout for {cluster.gpus} GPUs: TP {lay.tp} PP {lay.pp} VP {lay.vp} "
            f"DP {lay.dp} micro-batch {lay.micro_batch_size}: {gib(best.memory.total_bytes)} GiB, "
            f"{best.time.step_s:.2f} s/step (run without --tp/--cp/--pp/--vp to see the ranking)"
        )
    if tips:
        lines.append("what would change it (same GPUs):")
        lines += tips
    else:
        lines.append("nothing simple fits on these GPUs: use more GPUs (--gpus/--nodes) or a GPU with more memory")
    return "\n".join(lines)


def memory_savers(e: LayoutEstimate, workload: Workload) -> list[tuple[str, LayoutEstimate]]:
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
AS_GOOD_AS_BEST = 0.005
"""Within this much of the search's best step time, a layout counts as the calculator's choice (0.5%)."""


def against_best(slower: float, best: LayoutEstimate, evaluated: LayoutEstimate) -> list[str]:
    """How the evaluated layout compares with the search's best for the same GPUs, model, batch and savers. The
    search ranks the layouts that fit with the reserve before the tight ones, so a tight layout can be faster than
    its best: said as such, not as the best."""
    lay = best.layout
    factors = f"TP {lay.tp}{f' CP {lay.cp}' if lay.cp > 1 else ''} PP {lay.pp} VP {lay.vp} DP {lay.dp}"
    theirs = (
        f"{factors} micro-batch {lay.micro_batch_size}: {best.time.step_s:.3f} s/step, MFU {best.mfu:.1%}, "
        f"{gib(best.memory.total_bytes)} GiB"
    )
    if slower < -AS_GOOD_AS_BEST and evaluated.tight and not best.tight:
        return [
            f"this layout is {-slower:.1%} faster by this model than the calculator's best for these GPUs and flags, "
            f"but tight on memory; the search ranks layouts that fit with the reserve first, and its best is "
            f"{theirs}"
        ]
    if slower <= AS_GOOD_AS_BEST:
        return [f"calculator's best: this layout (or within {AS_GOOD_AS_BEST:.1%} of it) for these GPUs and flags"]
    return [
        f"calculator's best for these GPUs and flags: {theirs}; this layout is {slower:.1%} slower by this model "
        "(run without --tp/--cp/--pp/--vp for the ranking)"
    ]


def relative(value: float, reference: float) -> float:
    """``value`` over ``reference``, minus 1; 0 below a twentieth of a percent (no "-0.0%")."""
    change = value / reference - 1
    return 0.0 if abs(change) < 5e-4 else change


def schedule_lines(e: LayoutEstimate, workload: Workload) -> list[str]:
    """The layout's pipeline under every schedule, as a table (``schedule_comparison.py``)."""
    lay = e.layout
    options = compare_schedules(workload, e)
    if not options:
        return ["schedules: PP = 1, no pipeline: every schedule runs the same"]
    lines = [
        f"pipeline schedules for TP {lay.tp} PP {lay.pp} DP {lay.dp}, {lay.num_microbatches} microbatches, "
        "simulated pass by pass (GPipe is not a Megatron-Core schedule: shown for comparison only; pretrain_gpt.py "
        "--enable-zero-bubble runs ZB-H1, and ZB interleaved with virtual stages):",
        f" {'schedule':<46} {'bubble':>7} {'p2p s':>7} {'in flight':>9} {'act GiB':>8} {'peak GiB':>9} {'fits':>5} "
        f"{'p2p GB':>8} {'step s':>9} {'vs this':>8}",
    ]
    for o in options:
        if o.run is None:
            lines.append(f" {o.label:<46} not possible: {o.reason}")
            continue
        label = f"{o.label} *" if o.as_given else o.label
        lines.append(
            f" {label:<46} {o.run.bubble_share:>7.2%} {o.run.p2p_exposed:>7.3f} "
            f"{max(o.run.in_flight_microbatches):>9.1f} {gib(max(o.activation_bytes)):>8} {gib(o.peak_bytes):>9} "
            f"{FITS_COLUMN[o.verdict]:>5} {o.p2p_bytes / 1e9:>8.2f} {o.step_s:>9.3f} "
            f"{relative(o.step_s, e.time.step_s):>+8.1%}"
        )
    lines += [
        "*: the schedule as given; fits: as the layouts above (yes within the usable memory, tight within the "
        "card's capacity); "
        "bubble: idle share of the step with free transfers; p2p s: what the transfers add; in flight: most "
        "microbatches' activations a stage holds (GPipe all m, 1F1B at most PP; zero-bubble: until each W pass); "
        "act GiB: those activations on "
        "the most loaded stage; p2p GB: what the busiest rank sends per step; vs this: against the closed-form "
        f"estimate above ({e.time.step_s:.3f} s)",
    ]
    return lines


def saver_lines(found: SaverSearch) -> list[str]:
    """What the search had to turn on, and what it tried first."""
    lines = ["nothing fits with the flags as given; searched again with memory savers, cheapest first:"]
    for flags in found.tried:
        mark = "<- kept" if flags == found.added and found.result.fitting else ""
        lines.append(f"  + {' '.join(flags)} {mark}".rstrip())
    if found.result.fitting:
        lines.append(f"the layouts below need {' '.join(found.added)} (in the emitted flags)")
    return lines
