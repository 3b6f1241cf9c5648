"""The layout an elastic job runs on the nodes it was given (``recipes/common.sh`` calls this with ``ELASTIC=1``).

A job submitted with ``sbatch --nodes=MIN-MAX`` may start, or be requeued, on
another node count than its last checkpoint was written with. Before anything
launches, the recipe runs::

    python -m megatron_ext.cli.elastic --world-size N --gpus-per-node G --gpu PROFILE \\
        --recipe-world-size N0 --checkpoint-dir DIR --policy any|dp -- PRETRAIN_ARGS...

and evaluates what it prints: ``pretrain_args`` and ``calculator_args`` for the
layout the job runs, and ``relayout_record``, the metrics file's
``{"event": "relayout", ...}`` line when that layout differs from the
checkpoint's (empty otherwise). What changed and why goes to stderr.

The recipe's own layout is kept wherever it runs and fits, so a job that gets
its nodes back returns to it; otherwise the checkpoint's layout (or the
recipe's, before the first save) is re-planned by ``estimate.relayout`` with
the policy. Megatron-Core's resharding load then carries the checkpoint over.
A distributed optimizer saved per rank (``dp_reshardable``) loads under
another DP only: the plan then keeps TP, PP and VP, or says what to do.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shlex
import sys
from collections.abc import Sequence

from megatron_ext import notices
from megatron_ext.checkpoint import on_disk
from megatron_ext.checkpoint.records import SavedRun, per_rank_format_refusal
from megatron_ext.cli.recipe import calculator_args
from megatron_ext.config.arguments import ConfigError
from megatron_ext.config.exit_codes import ExitCode
from megatron_ext.config.layout_flags import replace_layout_flags
from megatron_ext.config.training_config import TrainingConfig, build_parser, expand_preset, parse_args
from megatron_ext.estimate.fp8 import fp8_peak
from megatron_ext.estimate.hardware import PROFILES, get_profile
from megatron_ext.estimate.relayout import (
    DEFAULT_POLICY,
    POLICIES,
    AllocationPlan,
    RelayoutError,
    describe,
    gpus,
    plan_allocation,
)
from megatron_ext.estimate.search import Cluster
from megatron_ext.estimate.workload import Workload
from megatron_ext.parallel.layout import LayoutError

NO_PROFILE = "none"
"""``--gpu none`` (CPU rehearsals): memory is not checked, layouts are ranked by ``RANKING_PROFILE``'s time model."""
RANKING_PROFILE = "h100-sxm"


def elastic_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m megatron_ext.cli.elastic",
        description="Choose the layout of an elastic job for its allocation; prints shell assignments.",
        allow_abbrev=False,
    )
    parser.add_argument("--world-size", type=int, required=True, help="Processes of this allocation.")
    parser.add_argument("--gpus-per-node", type=int, required=True, help="Processes per node (TP stays within).")
    parser.add_argument("--gpu", required=True, help=f"GPU profile ({', '.join(PROFILES)}) or {NO_PROFILE}.")
    parser.add_argument(
        "--recipe-world-size", type=int, required=True, help="The world size the recipe's layout was written for."
    )
    parser.add_argument("--checkpoint-dir", default="", help="Where the job saves and resumes (--save/--load).")
    parser.add_argument(
        "--policy", choices=POLICIES, default=DEFAULT_POLICY, help="any: best layout; dp: change DP only."
    )
    parser.add_argument("pretrain_args", nargs=argparse.REMAINDER, help="-- then the pretrain_gpt.py arguments.")
    return parser


def say(message: str) -> None:
    print(f"[elastic] {message}", file=sys.stderr)


def _recipe(argv: Sequence[str], *, world_size: int, recipe_world_size: int) -> tuple[TrainingConfig, str]:
    """The recipe's configuration on the allocation, and ''; where its layout does not run there, its
    configuration at its own world size (else at DP 1: outside a job ``NNODES`` is both) and why not.
    LayoutError when its layout runs nowhere."""
    try:
        return parse_args(argv, world_size=world_size), ""
    except LayoutError as exc:
        refusal = f"the recipe's layout does not run on {gpus(world_size)} ({exc.problems[0]})"
    try:
        return parse_args(argv, world_size=recipe_world_size), refusal
    except LayoutError:
        given, _ = build_parser().parse_known_args(expand_preset(argv))
        model_parallel = math.prod(
            getattr(given, f"parallel.{name}", 1)
            for name in ("tensor_model_parallel_size", "context_parallel_size", "pipeline_model_parallel_size")
        )
        return parse_args(argv, world_size=model_parallel), refusal


def _saved(checkpoint_dir: str) -> tuple[int, SavedRun] | None:
    """(iteration, SavedRun) of the latest checkpoint under ``checkpoint_dir``, or None."""
    if not checkpoint_dir:
        return None
    iteration = on_disk.read_tracker(checkpoint_dir)
    if not iteration:
        return None
    # Reading the common state takes torch: only once there is a checkpoint.
    from megatron_ext.training.checkpointing import saved_run

    run = saved_run(on_disk.checkpoint_dir(checkpoint_dir, iteration))
    return (iteration, run) if run is not None else None


def plan(args: argparse.Namespace, argv: list[str]) -> tuple[list[str], str]:
    """(pretrain_gpt.py arguments, metrics record or '') for the allocation; raises the errors ``main`` reports."""
    recipe_cfg, refusal = _recipe(argv, world_size=args.world_size, recipe_world_size=args.recipe_world_size)
    recipe = None if refusal else recipe_cfg.layout
    workload = Workload.of_config(recipe_cfg)
    gpu = get_profile(RANKING_PROFILE if args.gpu == NO_PROFILE else args.gpu)
    if args.gpu == NO_PROFILE:
        gpu = gpu.with_overrides(memory_gib=1e9)
        say(f"GPU_PROFILE={NO_PROFILE}: memory not checked; layouts ranked by the {RANKING_PROFILE} time model")
    if workload.fp8_format:
        try:
            fp8_peak(workload, gpu)
        except ValueError as exc:
            if args.gpu != NO_PROFILE:
                raise ConfigError(str(exc)) from None
            # Ranking only: MXFP8's block scales are computed in its cast kernels, as blockwise scaling's.
            workload = dataclasses.replace(workload, fp8_recipe="blockwise")
            say(f"--fp8-recipe {recipe_cfg.optim.fp8_recipe}: ranked as blockwise scaling on the {RANKING_PROFILE}")
    cluster = Cluster(gpus=args.world_size, gpus_per_node=args.gpus_per_node, gpu=gpu)
    if cluster.problems():
        raise ConfigError("; ".join(cluster.problems()))

    found = _saved(args.checkpoint_dir)
    iteration, saved = found if found else (0, None)
    saved_layout = saved.config.layout if saved else None

    def planned(policy: str) -> AllocationPlan:
        return plan_allocation(
            workload,
            cluster,
            recipe=recipe,
            recipe_refusal=refusal,
            base=saved_layout or recipe_cfg.layout,
            saved=saved_layout,
            policy=policy,
            # The flag as the recipe gives it: Megatron-LM turns it off at TP 1 only.
            sequence_parallel="--sequence-parallel" in argv,
        )

    result = planned(args.policy)

    if saved is not None and saved.config.layout.use_distributed_optimizer:
        per_rank = not saved.config.run.dist_ckpt_optim_fully_reshardable
        why_not = per_rank_format_refusal(saved.layout_record, result.layout.layout) if per_rank else None
        if why_not is not None and args.policy != "dp":
            say(f"{describe(result.layout.layout)} cannot load the per-rank optimizer state: keeping TP, PP and VP")
            try:
                result = planned("dp")
            except RelayoutError:
                raise RelayoutError(why_not) from None  # what to do about the format, not about the policy
            why_not = per_rank_format_refusal(saved.layout_record, result.layout.layout)
        if why_not is not None:
            raise RelayoutError(why_not)

    layout = result.layout.layout
    if saved_layout is not None:
        say(f"checkpoint of iteration {iteration}: {describe(saved_layout)}")
    say(f"{gpus(args.world_size)}: {describe(layout)} ({result.why})")
    if result.relayout is not None:
        say("changed: " + ", ".join(result.relayout.changes()))
    new_argv = argv if recipe is not None and layout == recipe else replace_layout_flags(argv, layout)
    record = json.dumps(result.relayout.record(iteration=iteration)) if result.relayout is not None else ""
    return new_argv, record


def main(argv: Sequence[str] | None = None) -> int:
    args = elastic_parser().parse_args(argv)
    pretrain = list(args.pretrain_args)
    if pretrain[:1] == ["--"]:
        pretrain = pretrain[1:]
    notices.install()  # before a checkpoint is read with torch
    try:
        new_argv, record = plan(args, pretrain)
    except (ConfigError, LayoutError) as exc:
        say(f"the recipe cannot run here, nothing re-planned: {exc}")
        return ExitCode.INVALID
    except RelayoutError as exc:
        say(f"no layout for {gpus(args.world_size)}: {exc}")
        return ExitCode.DOES_NOT_FIT
    except on_disk.CheckpointError as exc:
        say(f"cannot read the checkpoint's layout: {exc}")
        return ExitCode.CHECKPOINT
    sys.stdout.write(f"pretrain_args=({' '.join(shlex.quote(a) for a in new_argv)})\n")
    sys.stdout.write(f"calculator_args=({' '.join(shlex.quote(a) for a in calculator_args(new_argv))})\n")
    sys.stdout.write(f"relayout_record={shlex.quote(record)}\n")
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
