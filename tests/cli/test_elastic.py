"""``python -m megatron_ext.cli.elastic``: the layout an elastic job runs on its allocation (no checkpoint files:
the checkpoint's record is given as a ``SavedRun``; the real-cluster test reads real ones)."""

from __future__ import annotations

import json
import shlex

import pytest

from megatron_ext.checkpoint.records import SavedRun
from megatron_ext.cli import elastic
from megatron_ext.config.exit_codes import ExitCode
from megatron_ext.config.training_config import parse_args

pytestmark = pytest.mark.unit

RECIPE = [
    "--model", "gpt-tiny", "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "2",
    "--num-layers-per-virtual-pipeline-stage", "1", "--micro-batch-size", "2", "--global-batch-size", "8",
    "--mock-data", "--device", "cpu", "--use-distributed-optimizer", "--train-iters", "20",
]  # fmt: skip


def _saved(monkeypatch: pytest.MonkeyPatch, *extra: str) -> None:
    """The latest checkpoint: iteration 10 of the recipe on 2 processes (PP 2 × VP 2)."""
    cfg = parse_args([*RECIPE, *extra], world_size=2)
    layout = cfg.layout
    record = {"tp": layout.tp, "pp": layout.pp, "vp": layout.vp, "dp": layout.dp,
              "distributed_optimizer": True, "stages": [[c.num_layers for c in r] for r in layout.stages]}  # fmt: skip
    monkeypatch.setattr(elastic, "_saved", lambda _dir: (10, SavedRun(config=cfg, layout_record=record)))


def _run(capsys: pytest.CaptureFixture[str], world_size: int, *argv: str) -> tuple[int, dict[str, str], str]:
    code = elastic.main(
        ["--world-size", str(world_size), "--gpus-per-node", "1", "--gpu", "none", "--recipe-world-size", "2",
         "--checkpoint-dir", "ckpt", "--", *argv]
    )  # fmt: skip
    out, err = capsys.readouterr()
    values = {}
    for line in out.splitlines():
        name, _, value = line.partition("=")
        values[name] = value
    return code, values, err


def test_a_fully_reshardable_checkpoint_moves_to_one_process(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _saved(monkeypatch, "--dist-ckpt-optim-fully-reshardable")
    code, values, err = _run(capsys, 1, *RECIPE, "--dist-ckpt-optim-fully-reshardable")
    assert code == ExitCode.OK, err
    argv = shlex.split(values["pretrain_args"][1:-1])
    assert parse_args(argv, world_size=1).layout.pp == 1 and "--num-layers-per-virtual-pipeline-stage" not in argv
    record = json.loads(shlex.split(values["relayout_record"])[0])
    assert (record["iteration"], record["old"]["pp"], record["new"]["pp"]) == (10, 2, 1)
    assert "changed: GPUs 2 -> 1, PP 2 -> 1, VP 2 -> 1" in err


def test_a_per_rank_optimizer_state_keeps_its_model_parallel_layout_or_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Saved per rank (Megatron-LM's default), the state loads under another DP only."""
    _saved(monkeypatch)
    # 4 processes: the recipe's PP 2 × VP 2 with DP 2 runs and keeps the state loadable.
    code, values, err = _run(capsys, 4, *RECIPE)
    assert code == ExitCode.OK, err
    assert json.loads(shlex.split(values["relayout_record"])[0])["new"]["dp"] == 2
    # 1 process: PP 2 cannot stay; the refusal says what to do.
    code, values, err = _run(capsys, 1, *RECIPE)
    assert code == ExitCode.DOES_NOT_FIT and not values
    assert "saved per rank" in err and "--dist-ckpt-optim-fully-reshardable" in err


def test_the_same_allocation_changes_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _saved(monkeypatch)
    code, values, err = _run(capsys, 2, *RECIPE)
    assert code == ExitCode.OK, err
    assert shlex.split(values["pretrain_args"][1:-1]) == RECIPE and values["relayout_record"] == "''"


@pytest.mark.parametrize(
    ("gpu", "code", "said"),
    [
        ("none", ExitCode.OK, "--fp8-recipe mxfp8: ranked as blockwise scaling on the h100-sxm"),
        ("h100-sxm", ExitCode.INVALID, "the h100-sxm profile's tensor cores have no MXFP8"),
    ],
)
def test_an_fp8_recipe_the_profile_lacks_is_ranked_on_a_cpu_rehearsal_and_refused_on_that_gpu(
    capsys: pytest.CaptureFixture[str], gpu: str, code: ExitCode, said: str
) -> None:
    """MXFP8 is Blackwell's: with ``--gpu none`` the layouts are still ranked (as blockwise scaling, whose block
    scales are computed in the cast kernels too); on a Hopper profile the plan stops with the reason, no
    traceback."""
    on_gpus = [a for a in RECIPE if a not in ("--device", "cpu")]
    fp8 = [*on_gpus, "--bf16", "--fp8-format", "hybrid", "--fp8-recipe", "mxfp8"]
    got = elastic.main(
        ["--world-size", "2", "--gpus-per-node", "1", "--gpu", gpu, "--recipe-world-size", "2", "--", *fp8]
    )
    assert got == code
    assert said in capsys.readouterr().err


def test_a_recipes_sequence_parallel_flag_comes_back_when_the_re_plan_gives_it_tensor_parallelism(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A recipe at TP 1 with --sequence-parallel (Megatron-LM turns it off at TP 1 only) re-planned to TP > 1
    keeps it. Before, the re-plan searched with the recipe's TP 1 layout's (off) and dropped the flag."""
    recipe = ["--model", "gpt3-175b", "--bf16", "--sequence-parallel", "--use-distributed-optimizer",
              "--micro-batch-size", "1", "--global-batch-size", "1536", "--mock-data", "--train-iters", "10"]  # fmt: skip
    code = elastic.main(
        ["--world-size", "128", "--gpus-per-node", "8", "--gpu", "h100-sxm", "--recipe-world-size", "64", "--",
         *recipe]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == ExitCode.OK, err
    (line,) = [line for line in out.splitlines() if line.startswith("pretrain_args=")]
    cfg = parse_args(shlex.split(line.removeprefix("pretrain_args=")[1:-1]), world_size=128)
    assert cfg.layout.tp > 1 and cfg.layout.sequence_parallel
