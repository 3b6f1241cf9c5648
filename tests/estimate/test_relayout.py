"""Re-planning a layout for another GPU count: the model and global batch stay, the layout follows the GPUs."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from megatron_ext.cli.layout import main as layout_tool
from megatron_ext.config.arguments import ModelArgs
from megatron_ext.config.exit_codes import ExitCode
from megatron_ext.config.layout_flags import model_layout_facts
from megatron_ext.config.presets import get_preset
from megatron_ext.estimate.hardware import get_profile
from megatron_ext.estimate.relayout import RelayoutError, relayout
from megatron_ext.estimate.search import Cluster, search
from megatron_ext.estimate.workload import Workload
from megatron_ext.parallel.layout import ParallelLayout

pytestmark = pytest.mark.unit


def _job(preset: str, gpus: int, **layout: Any) -> tuple[Workload, ParallelLayout]:
    workload = Workload(
        model=ModelArgs(**get_preset(preset).model_flags()), precision="bf16", recompute_granularity="selective"
    )
    facts: dict[str, Any] = model_layout_facts(workload.model)
    old = ParallelLayout(world_size=gpus, gpus_per_node=8, use_distributed_optimizer=True, **layout, **facts)
    return workload, old


def _cluster(gpus: int) -> Cluster:
    return Cluster(gpus=gpus, gpus_per_node=8, gpu=get_profile("h100-sxm"))


def test_any_policy_takes_the_searchs_best_for_the_new_gpus_with_the_same_batch() -> None:
    """GPT-3 175B's recipe layout (TP 4 PP 8 VP 12 on 16 nodes) after losing 4 nodes, and back on 16."""
    workload, old = _job(
        "gpt3-175b", 128, tensor_model_parallel_size=4, pipeline_model_parallel_size=8,
        virtual_pipeline_model_parallel_size=12, sequence_parallel=True, micro_batch_size=1, global_batch_size=1536,
    )  # fmt: skip
    shrunk = relayout(workload, old, _cluster(96), policy="any")
    new = shrunk.new.layout
    assert new.world_size == 96 and new.global_batch_size == 1536 and shrunk.new.fits
    assert new.tp <= 8 and new.sequence_parallel and new.use_distributed_optimizer
    best = search(workload, _cluster(96), global_batch_size=1536, sequence_parallel=True,
                  use_distributed_optimizer=True).fitting[0]  # fmt: skip
    assert (new.tp, new.pp, new.vp, new.dp, new.micro_batch_size) == (
        best.layout.tp, best.layout.pp, best.layout.vp, best.layout.dp, best.layout.micro_batch_size
    )  # fmt: skip
    record = shrunk.record(iteration=120)
    assert record["event"] == "relayout" and record["iteration"] == 120 and record["policy"] == "any"
    assert record["old"]["dp"] == 4 and record["new"]["world_size"] == 96
    assert "GPUs 128 -> 96" in shrunk.changes()
    # Growing back: the recipe's own layout is the best again.
    grown = relayout(workload, new, _cluster(128), policy="any").new.layout
    assert (grown.tp, grown.pp, grown.vp, grown.dp) == (4, 8, 12, 4)


def test_dp_policy_keeps_the_model_parallel_layout_and_changes_dp_only() -> None:
    workload, old = _job(
        "gpt3-13b", 32, pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=10,
        micro_batch_size=1, global_batch_size=1024,
    )  # fmt: skip
    plan = relayout(workload, old, _cluster(16), policy="dp")
    new = plan.new.layout
    assert (new.tp, new.pp, new.vp, new.micro_batch_size) == (1, 2, 10, 1)
    assert (new.dp, new.num_microbatches, new.global_batch_size) == (8, 128, 1024)
    assert plan.changes() == ["GPUs 32 -> 16", "DP 16 -> 8", "microbatches 64 -> 128"]


def test_dp_policy_refuses_what_it_cannot_keep_and_says_what_would_work() -> None:
    workload, old = _job(
        "gpt3-175b", 128, tensor_model_parallel_size=4, pipeline_model_parallel_size=8,
        virtual_pipeline_model_parallel_size=12, sequence_parallel=True, micro_batch_size=1, global_batch_size=1536,
    )  # fmt: skip
    with pytest.raises(RelayoutError, match=r"a multiple of 32, or let the layout change \(policy any\)"):
        relayout(workload, old, _cluster(100), policy="dp")
    # 12 nodes keep TP 4 × PP 8 with DP 3, but the optimizer shards over 3 instead of 4: it no longer fits.
    with pytest.raises(RelayoutError, match=r"no layout of 96 GPUs \(policy dp\) fits .* \(the smallest needs"):
        relayout(workload, old, _cluster(96), policy="dp")
    with pytest.raises(RelayoutError, match="unknown relayout policy"):
        relayout(workload, old, _cluster(96), policy="pp")


def _run(args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = layout_tool(args.split(), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_the_calculator_replans_from_the_flags_the_job_ran_with() -> None:
    common = (
        "--gpu h100-sxm --model gpt3-175b --bf16 --sequence-parallel --use-distributed-optimizer "
        "--recompute-granularity selective --global-batch-size 1536 --tp 4 --pp 8 "
        "--num-layers-per-virtual-pipeline-stage 1 --relayout-from-gpus 128"
    )
    code, out, _ = _run(f"--nodes 12 {common} --json")
    assert code == ExitCode.OK
    doc = json.loads(out)
    assert doc["mode"] == "relayout" and doc["relayout"]["event"] == "relayout"
    assert doc["relayout"]["old"] == {
        "world_size": 128, "tp": 4, "cp": 1, "pp": 8, "vp": 12, "dp": 4, "micro_batch_size": 1,
        "num_microbatches": 384,
    }  # fmt: skip
    new = doc["layouts"][0]
    assert new["global_batch_size"] == 1536 and doc["cluster"]["world_size"] == 96
    assert f"--pipeline-model-parallel-size {new['pp']}" in new["pretrain_flags"]
    code, out, _ = _run(f"--nodes 12 {common}")
    assert (
        code == ExitCode.OK
        and "relayout (policy any): TP 4 PP 8 VP 12 DP 4" in out
        and "changed: GPUs 128 -> 96" in out
    )
    code, out, err = _run(f"--nodes 12 {common} --relayout-policy dp --json")
    assert code == ExitCode.DOES_NOT_FIT and "no layout of 96 GPUs (policy dp) fits" in err
    assert json.loads(out)["errors"] == [err.removeprefix("error: ").strip()]
    # The flags must describe a layout that ran: TP 4 × PP 8 does not divide 120 GPUs.
    code, _, err = _run(f"--nodes 12 {common.replace('--relayout-from-gpus 128', '--relayout-from-gpus 120')}")
    assert code == ExitCode.INVALID and "does not run on --relayout-from-gpus 120" in err


def test_the_replan_keeps_the_jobs_sequence_parallel_flag_and_prints_what_was_asked() -> None:
    """Before: a job given --sequence-parallel at TP 1 (where Megatron-LM turns it off) was re-planned to TP > 1
    without it; --explain and --compare-schedules printed nothing; --relayout-policy without --relayout-from-gpus
    was ignored without a word."""
    common = "--gpu h100-sxm --model gpt3-175b --bf16 --sequence-parallel --use-distributed-optimizer --nodes 12"
    code, out, _ = _run(f"{common} --micro-batch-size 1 --relayout-from-gpus 128 --json")
    assert code == ExitCode.OK
    (new,) = json.loads(out)["layouts"]
    assert new["tp"] > 1 and new["sequence_parallel"] and "--sequence-parallel" in new["pretrain_flags"]
    code, out, _ = _run(f"{common} --tp 4 --pp 8 --vp 12 --relayout-from-gpus 128 --explain --compare-schedules")
    assert code == ExitCode.OK and "sequence parallelism on where TP > 1" in out
    assert "pipeline schedules for" in out and "weights" in out
    for policy in ("dp", "any"):
        code, _, err = _run(f"--gpus 64 --gpu h100-sxm --model gpt3-13b --bf16 --relayout-policy {policy}")
        assert code == ExitCode.INVALID and "--relayout-policy goes with --relayout-from-gpus N" in err


def test_layout_flags_are_replaced_and_every_other_argument_kept() -> None:
    """How a launcher moves a command line to another layout: the parser rebuilds exactly the new layout."""
    from megatron_ext.config.layout_flags import replace_layout_flags
    from megatron_ext.config.training_config import parse_args

    argv = [
        "--model", "gpt-tiny", "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "2",
        "--virtual-pipeline-model-parallel-size", "2", "--account-for-embedding-in-pipeline-split",
        "--account-for-loss-in-pipeline-split", "--micro-batch-size", "2", "--global-batch-size", "8",
        "--mock-data", "--lr", "3e-3", "--use-distributed-optimizer", "--seed", "7",
    ]  # fmt: skip
    argv[2:2] = ["--num-layers", "6"]  # with the embedding and the loss: 8 units, 2 per virtual stage
    target = parse_args([*argv[:4], "--global-batch-size", "8", "--mock-data", "--micro-batch-size", "4",
                         "--use-distributed-optimizer"], world_size=2).layout  # fmt: skip
    assert (target.pp, target.dp, target.micro_batch_size) == (1, 2, 4)
    moved = replace_layout_flags(argv, target)
    for gone in ("--virtual-pipeline-model-parallel-size", "--account-for-embedding-in-pipeline-split",
                 "--account-for-loss-in-pipeline-split"):  # fmt: skip
        assert gone not in moved, moved
    assert moved.count("--tensor-model-parallel-size") == moved.count("--micro-batch-size") == 1
    # Everything that is not layout stays, in order; the layout's own flags come last.
    assert moved[:9] == ["--model", "gpt-tiny", "--num-layers", "6", "--global-batch-size", "8", "--mock-data",
                         "--lr", "3e-3"]  # fmt: skip
    assert moved[9:11] == ["--seed", "7"]
    assert parse_args(moved, world_size=2).layout == target
    # And back: the interleaved, uneven recipe layout round-trips through its own flags.
    recipe = parse_args(argv, world_size=2).layout
    assert parse_args(replace_layout_flags(moved, recipe), world_size=2).layout == recipe


def test_an_allocation_keeps_the_recipes_layout_where_it_fits_and_records_every_change() -> None:
    """The elastic launcher's choice: the recipe's layout on the GPUs it was written for (the grow case), a
    re-plan where it does not run or does not fit, and a relayout record whenever the checkpoint's differs."""
    from megatron_ext.estimate.relayout import plan_allocation
    from megatron_ext.estimate.search import evaluate

    workload, recipe = _job(
        "gpt3-175b", 128, tensor_model_parallel_size=4, pipeline_model_parallel_size=8,
        virtual_pipeline_model_parallel_size=12, sequence_parallel=True, micro_batch_size=1, global_batch_size=1536,
    )  # fmt: skip
    # 96 GPUs: the recipe's TP 4 × PP 8 runs (DP 3) but does not fit (the optimizer over 3 shards): re-planned.
    on_96 = ParallelLayout.check(**recipe.as_values() | {"world_size": 96})[0]
    assert not evaluate(workload, on_96, _cluster(96)).fits_with_reserve
    shrunk = plan_allocation(
        workload, _cluster(96), recipe=on_96, recipe_refusal="", base=recipe, saved=recipe, policy="any"
    )
    assert "GiB per GPU" in shrunk.why and shrunk.layout.fits_with_reserve and shrunk.layout.layout.world_size == 96
    assert shrunk.relayout is not None and shrunk.relayout.record(iteration=7)["why"] == shrunk.why
    # Back on 128 GPUs from the shrunk checkpoint: the recipe's own layout, recorded as a change.
    grown = plan_allocation(
        workload, _cluster(128), recipe=recipe, recipe_refusal="", base=shrunk.layout.layout,
        saved=shrunk.layout.layout, policy="any",
    )  # fmt: skip
    assert grown.layout.layout == recipe and grown.why == "the recipe's layout runs on 128 GPUs"
    assert grown.relayout is not None and grown.relayout.record()["new"]["pp"] == 8
    # The same layout as the checkpoint's: nothing to record.
    same = plan_allocation(
        workload, _cluster(128), recipe=recipe, recipe_refusal="", base=recipe, saved=recipe, policy="dp"
    )
    assert same.relayout is None
    # A layout that does not run at all: re-planned, the refusal quoted.
    refused = plan_allocation(
        workload, _cluster(120), recipe=None, recipe_refusal="PP 8 × TP 4 does not divide 120", base=recipe,
        saved=None, policy="any",
    )  # fmt: skip
    assert refused.why.startswith("PP 8 × TP 4 does not divide 120; re-planned") and refused.relayout is None
