"""The flag table drives every parser and every emitted command line; config building is pure."""

from __future__ import annotations

import dataclasses
import shlex
import subprocess
import sys

import pytest

from megatron_ext.cli.layout_args import build_parser as calculator_parser
from megatron_ext.cli.layout_args import model_constant_fields
from megatron_ext.config.arguments import ModelArgs
from megatron_ext.config.flags import flag_of, options, to_argv
from megatron_ext.config.presets import PRESETS
from megatron_ext.config.training_config import GROUPS, build_parser, expand_preset, parse_args, preset_argv
from megatron_ext.estimate.coverage import APPROXIMATED
from megatron_ext.estimate.search import pretrain_flags
from megatron_ext.estimate.workload import Workload
from tests.conftest import REPO
from tests.waits import QUICK_S

pytestmark = pytest.mark.unit


def _flags(parser: object) -> set[str]:
    return {s for action in parser._actions for s in action.option_strings}  # type: ignore[attr-defined]


def test_every_field_is_a_pretrain_flag_and_every_modelled_one_a_calculator_flag() -> None:
    pretrain, calculator = _flags(build_parser()), _flags(calculator_parser())
    for cls in GROUPS.values():
        for f in options(cls):
            assert flag_of(f) in pretrain, f.name
            # --world-size is also the calculator's own spelling of --gpus; the flags the estimate approximates are
            # taken too (and said), and the model's constants that change nothing (so a printed command comes back).
            constants = {c.name for c in model_constant_fields()} if cls is ModelArgs else set()
            taken = f.metadata["estimate"] or f.name in APPROXIMATED or f.name in constants
            assert (flag_of(f) in calculator) == taken or flag_of(f) == "--world-size", f.name
            if f.metadata["short"]:
                assert f.metadata["short"] in calculator and f.metadata["short"] not in pretrain


def test_emitted_command_line_parses_back_to_the_same_values() -> None:
    model = ModelArgs(
        num_layers=8, hidden_size=256, num_attention_heads=8, group_query_attention=True, num_query_groups=2,
        swiglu=True, normalization="RMSNorm", position_embedding_type="rope", vocab_size=1000, seq_length=64,
    )  # fmt: skip
    argv = to_argv(model)
    assert "--num-query-groups" in argv and "--hidden-dropout" not in argv  # defaults stay implicit
    cfg = parse_args([*argv, "--mock-data"])
    assert cfg.model == model


@pytest.mark.parametrize(
    "layout_flags",
    [
        "--num-layers-per-virtual-pipeline-stage 2",
        "--num-virtual-stages-per-pipeline-rank 2 --decoder-first-pipeline-num-layers 2",
        "--num-virtual-stages-per-pipeline-rank 2 --microbatch-group-size-per-virtual-pipeline-stage 4",
        "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split",
        "--pipeline-model-parallel-layout Ett|(t*3|)*1,tt|tL",
    ],
)
def test_the_calculators_flags_are_what_pretrain_gpt_builds(layout_flags: str) -> None:
    cfg = parse_args(
        "--mock-data --num-layers 8 --hidden-size 64 --num-attention-heads 4 --tensor-model-parallel-size 2 "
        "--pipeline-model-parallel-size 2 --sequence-parallel --global-batch-size 16 --bf16 --recompute-granularity "
        f"full --recompute-method block --recompute-num-layers 1 --vocab-size 500 {layout_flags}".split(),
        world_size=8,
    )
    workload = Workload(model=cfg.model, precision="bf16", recompute_granularity="full", recompute_method="block")
    emitted = shlex.split(" ".join(pretrain_flags(workload, cfg.layout)))
    again = parse_args([*emitted, "--mock-data"], world_size=8)
    assert again.layout == cfg.layout and again.model == cfg.model
    assert again.layout.stages == cfg.layout.stages
    assert (again.optim.bf16, again.optim.recompute_method) == (True, "block")


def test_model_preset_expands_and_later_flags_win() -> None:
    for name in PRESETS:
        cfg = parse_args([*preset_argv(name), "--mock-data"])
        assert (cfg.model.num_layers, cfg.model.hidden_size) == (PRESETS[name].num_layers, PRESETS[name].hidden_size)
    argv = expand_preset(["--model", "gpt3-13b", "--num-layers", "8", "--mock-data"])
    assert parse_args(argv).model.num_layers == 8
    assert parse_args(["--model", "gpt3-13b", "--mock-data"]).model.hidden_size == 5120


def test_config_and_the_recipe_resolver_import_no_torch() -> None:
    """Pure: a login node (or the recipes' launcher) resolves a command line without torch or files; the
    checkpoint format, the elastic planner and the entry's checks read checkpoints without torch."""
    pure = (
        "megatron_ext.parallel.layout, megatron_ext.config.training_config, megatron_ext.cli.recipe, "
        "megatron_ext.estimate.search"
    )
    format_side = (
        "megatron_ext.checkpoint.on_disk, megatron_ext.checkpoint.records, megatron_ext.cli.elastic, "
        "megatron_ext.training.entry"
    )
    code = (
        f"import sys; import {pure}; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron', 'numpy')); "
        f"import {format_side}; "
        "bad += sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron')); "
        "print(bad); sys.exit(1 if bad else 0)"
    )  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=QUICK_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_option_fields_all_have_help() -> None:
    for cls in GROUPS.values():
        for f in dataclasses.fields(cls):
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help text"


def test_every_layout_flag_is_modelled_by_the_calculator() -> None:
    """A ParallelArgs field that the layout takes (by name) must also be one the calculator reads and emits."""
    from megatron_ext.config.arguments import ParallelArgs
    from megatron_ext.config.layout_flags import LAYOUT_FLAGS

    modelled = {f.name for f in options(ParallelArgs, estimate=True)}
    assert {"tensor_model_parallel_size", "pipeline_model_parallel_size", "sequence_parallel"} <= LAYOUT_FLAGS
    assert modelled >= LAYOUT_FLAGS
