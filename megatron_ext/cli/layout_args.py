"""The command line of ``tools/layout.py``: its parser, and the cluster, model and layout it builds from the flags.

``layout`` (search, evaluate, re-plan) and ``layout_calibrate`` (``--calibrate``, which rebuilds each measured
run's model and layout from its record's flags) both read their inputs here. Model and training flags are
``pretrain_gpt.py``'s, from the flag table, so a recipe passes the same ones to both programs.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from megatron_ext.config.arguments import BatchArgs, ConfigError, ModelArgs, ParallelArgs
from megatron_ext.config.flags import Parser, add_options, options
from megatron_ext.config.layout_flags import (
    build_layout,
    context_parallel_problem,
    megatron_lm_adjustments,
    pipeline_p2p_problems,
    wgrad_deferral_problems,
    zero_bubble_problems,
)
from megatron_ext.config.optimizer_args import OptimizerArgs
from megatron_ext.config.presets import PRESETS, get_preset
from megatron_ext.config.training_config import cross_group_problems, without_transformer_engine
from megatron_ext.estimate.coverage import APPROXIMATED, NO_EFFECT
from megatron_ext.estimate.hardware import PROFILES, get_profile
from megatron_ext.estimate.relayout import DEFAULT_POLICY, POLICIES
from megatron_ext.estimate.search import DEFAULT_MEMORY_HEADROOM, Cluster
from megatron_ext.estimate.workload import Workload
from megatron_ext.parallel.layout import LayoutError, ParallelLayout

DEFAULT_PROFILE = "h100-sxm"


class LayoutToolError(ValueError):
    """Input the layout tool cannot use; the message says what to give instead."""


def _add_modelled_flags(group: argparse._ArgumentGroup, cls: type) -> None:
    """``cls``'s pretrain_gpt.py flags that the calculator models (``estimate=True`` in the flag table), and those
    it approximates (``coverage.APPROXIMATED``: taken, said, and carried into the printed command)."""
    add_options(group, cls, options(cls, estimate=True), suppress_defaults=False, short_aliases=True)
    add_options(group, cls, approximated_fields(cls), suppress_defaults=False)


def approximated_fields(cls: type) -> list[Any]:
    """The flags of ``cls`` that the estimate approximates (``coverage.APPROXIMATED``)."""
    return [f for f in options(cls, estimate=False) if f.name in APPROXIMATED]


def model_constant_fields() -> list[Any]:
    """The model's flags that change neither memory nor time (``coverage.NO_EFFECT``: the rotary frequencies, the
    norm's epsilon, a window that covers the sequence, ...). Taken, so that the ``pretrain_gpt.py`` command the
    calculator prints for a preset is one it takes back, and checked as ``pretrain_gpt.py`` checks them."""
    return [f for f in options(ModelArgs, estimate=False) if f.name in NO_EFFECT]


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
            "TP × CP × PP × VP × DP × micro-batch layouts by estimated memory and step time, or evaluate one. "
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
    cluster.add_argument(
        "--peak-tflops",
        type=float,
        help="Override the profile's dense bf16/fp16 peak, TFLOP/s; its FP8 and fp32 peaks move by the same factor.",
    )
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
    add_options(model, ModelArgs, model_constant_fields(), suppress_defaults=False)
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
        help=f"{DEFAULT_POLICY} (the default): the best layout for the new GPU count; dp: keep TP, CP, PP and VP, "
        "change DP only (with --relayout-from-gpus).",
    )
    out.add_argument(
        "--compare-schedules",
        action="store_true",
        help="Simulate the chosen layout's pipeline under GPipe (for comparison), 1F1B, interleaved 1F1B and "
        "interleaved 1F1B with the best microbatch group: bubble, exposed p2p, activations in flight, p2p "
        "volume and step time side by side.",
    )
    _add_calibration_arguments(parser)
    return parser


def _add_calibration_arguments(parser: argparse.ArgumentParser) -> None:
    """``--calibrate METRICS [...]`` and where the fitted profile goes (``layout_calibrate``)."""
    group = parser.add_argument_group(
        "calibration (fit a profile to your own runs; then --gpu FILE.json predicts with it)"
    )
    group.add_argument(
        "--calibrate",
        nargs="+",
        type=Path,
        metavar="METRICS",
        help="The --metrics-file of one or more short pretrain_gpt.py runs on your hardware (--timing-log-level 2, "
        "a few logged iterations; two layouts, e.g. one with TP and one with PP, constrain the most): fit the "
        "profile's rates to them (--gpu: the profile to start from; default the runs' GPU's).",
    )
    group.add_argument("--profile-out", type=Path, metavar="FILE.json", help="Where --calibrate writes the profile.")
    group.add_argument("--profile-name", help="The calibrated profile's name (default: --profile-out's stem).")


# ---------------------------------------------------------------- inputs
def cluster_of(args: argparse.Namespace) -> Cluster:
    try:
        gpu = get_profile(args.gpu or DEFAULT_PROFILE)
    except ValueError as exc:
        raise LayoutToolError(str(exc)) from None
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
        raise LayoutToolError("give the GPU count: --gpus N (or --world-size N), or --nodes N")
    if args.nodes is not None and args.nodes < 1:
        raise LayoutToolError(f"--nodes must be at least 1, got {args.nodes}")
    gpus = args.gpus if args.gpus is not None else args.nodes * args.gpus_per_node
    cluster = Cluster(gpus=gpus, gpus_per_node=args.gpus_per_node, gpu=gpu, memory_headroom=args.memory_headroom)
    problems = cluster.problems()
    if problems:
        raise LayoutToolError("; ".join(problems))
    return cluster


def workload_of(args: argparse.Namespace) -> tuple[Workload, int | None]:
    """The model and training options, and the preset's global batch size (if a preset was given)."""
    values: dict[str, Any] = {}
    preset_batch = None
    if args.model is not None:
        try:
            preset = get_preset(args.model)
        except ValueError as exc:
            raise LayoutToolError(str(exc)) from None
        values.update(preset.model_flags())
        preset_batch = preset.global_batch_size
    values.update(
        _given(args, [*options(ModelArgs, estimate=True), *approximated_fields(ModelArgs), *model_constant_fields()])
    )
    missing = [
        f"--{n.replace('_', '-')}" for n in ("num_layers", "hidden_size", "num_attention_heads") if n not in values
    ]
    if missing:
        raise LayoutToolError(f"give --model NAME or the model shape: {', '.join(missing)} missing")
    if "seq_length" not in values:
        raise LayoutToolError("give --seq-length (tokens per sequence)")
    values.setdefault("vocab_size", 50257)
    # The training options as pretrain_gpt.py's groups take them, checked by the same rules.
    optim = _given(args, [*options(OptimizerArgs, estimate=True), *approximated_fields(OptimizerArgs)])
    try:
        model, optimizer = ModelArgs(**values), OptimizerArgs(**optim)
        parallel = ParallelArgs(
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
        )
        # What pretrain_gpt.py refuses before building anything is not priced (on the GPUs the calculator plans).
        cross_group_problems(model, parallel, optimizer, device="cuda")
        workload = Workload.of_flags(
            model,
            optimizer,
            parallel,
            BatchArgs(**_given(args, approximated_fields(BatchArgs))),
            tokenizer_vocab_size=args.tokenizer_vocab_size,
        )
    except (ConfigError, ValueError) as exc:
        raise LayoutToolError(str(exc)) from None
    return workload, preset_batch


def evaluate_layout_from_flags(
    args: argparse.Namespace, workload: Workload, cluster: Cluster, batch: int | None
) -> tuple[ParallelLayout, tuple[str, ...]]:
    """The layout of the given flags, built exactly as ``pretrain_gpt.py`` builds it (LayoutError if invalid),
    and the flags changed on the way as Megatron-LM changes them (each with why)."""
    given = {
        f.name: getattr(args, f.name)
        for f in [*options(ParallelArgs, estimate=True), *approximated_fields(ParallelArgs)]
    }
    try:
        parallel = ParallelArgs(**{name: value for name, value in given.items() if value is not None})
    except ConfigError as exc:  # an out-of-range factor (--tp 0): the same one-line refusal as a broken rule
        raise LayoutError([str(exc)]) from None
    # The layout's own factor against the model (the other cross-group rules were checked with the workload).
    if (refusal := context_parallel_problem(workload.model, parallel.context_parallel_size)) is not None:
        raise LayoutError([str(refusal)])
    parallel, notes = megatron_lm_adjustments(parallel)
    batch_args = BatchArgs(
        micro_batch_size=1 if args.micro_batch_size is None else args.micro_batch_size, global_batch_size=batch
    )
    layout = build_layout(
        workload.model, parallel, batch_args, world_size=cluster.gpus, gpus_per_node=cluster.gpus_per_node
    )
    try:
        pipeline_p2p_problems(parallel, layout)
        # What pretrain_gpt.py refuses is not priced.
        zero_bubble_problems(
            parallel, layout, transformer_engine=without_transformer_engine(workload.model, "cuda") is None
        )
        wgrad_deferral_problems(parallel, layout)
    except ConfigError as exc:
        raise LayoutError([str(exc)]) from None
    return layout, notes
