"""megatron_ext.cli.recipe: a recipe's environment through the flag table into a command line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from megatron_ext.cli.recipe import RecipeError, calculator_args, resolve, table_variables, variables
from megatron_ext.config.exit_codes import ExitCode
from megatron_ext.config.training_config import parse_args
from tests.conftest import REPO
from tests.data.helpers import shared_data
from tests.waits import QUICK_S

pytestmark = pytest.mark.unit

TINY = ["--model", "gpt-tiny", "--lr", "3e-3"]


def test_variables_become_the_flags_of_their_fields() -> None:
    env = {"TP": "2", "PP": "2", "VP_LAYERS": "1", "SEQUENCE_PARALLEL": "1", "DISTRIBUTED_OPTIMIZER": "1",
           "MICRO_BATCH": "2", "GLOBAL_BATCH": "16", "PRECISION": "fp32", "DEVICE": "cpu", "TRAIN_ITERS": "7",
           "CHECKPOINT_DIR": "/ckpt", "EXTRA_ARGS": "--seed 7"}  # fmt: skip
    pretrain, calculator = resolve(TINY, env)
    cfg = parse_args([*pretrain, "--world-size", "8"])
    assert (cfg.layout.tp, cfg.layout.pp, cfg.layout.vp, cfg.layout.dp) == (2, 2, 2, 2)
    assert cfg.layout.sequence_parallel and cfg.layout.use_distributed_optimizer
    assert (cfg.run.train_iters, cfg.run.save, cfg.run.load, cfg.optim.seed) == (7, "/ckpt", "/ckpt", 7)
    assert cfg.data.mock_data and cfg.model.num_layers == 4 and not cfg.optim.bf16
    assert "--overlap-grad-reduce" not in pretrain  # OVERLAP defaults to 0 on CPU
    # The calculator gets the modelled flags only, with their values.
    assert "--lr" not in calculator and "--train-iters" not in calculator
    assert calculator[calculator.index("--tensor-model-parallel-size") + 1] == "2"


@pytest.mark.parametrize(
    ("env", "chunks"),
    [
        ({"PP": "2", "VP": "2", "FIRST_STAGE_LAYERS": "2"}, [[1, 1], [1, 1]]),
        ({"PP": "2", "PIPELINE_LAYOUT": "E|tt|t|tL"}, [[0, 1], [2, 1]]),
        ({"PP": "3", "ACCOUNT_FOR_EMBEDDING": "1", "ACCOUNT_FOR_LOSS": "1"}, [[1], [2], [1]]),
    ],
)
def test_uneven_stage_variables(env: dict[str, str], chunks: list[list[int]]) -> None:
    pretrain, calculator = resolve(TINY, {"DEVICE": "cpu", "GLOBAL_BATCH": "8", **env})
    cfg = parse_args([*pretrain, "--world-size", env["PP"]])
    assert [[c.num_layers for c in rank] for rank in cfg.layout.stages] == chunks
    # The calculator models the split: it gets the same flags.
    assert parse_args([*calculator, "--mock-data", "--world-size", env["PP"]]).layout == cfg.layout


def test_gpu_defaults_overlap_and_fuse() -> None:
    pretrain, _ = resolve(TINY, {"DISTRIBUTED_OPTIMIZER": "1"})
    assert {"--bf16", "--overlap-grad-reduce", "--overlap-param-gather", "--cross-entropy-loss-fusion"} <= set(pretrain)
    assert pretrain[pretrain.index("--device") + 1] == "cuda"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PRECISION": "bf32"}, "PRECISION must be bf16, fp16 or fp32"),
        ({"RECOMPUTE": "some"}, "RECOMPUTE must be none, selective or full"),
        ({"SEQUENCE_PARALLEL": "yes"}, "SEQUENCE_PARALLEL must be 0 or 1"),
        ({"TP": "two"}, "--tensor-model-parallel-size"),
        ({"DATA_PATH": "/data/web"}, "set TOKENIZER_MODEL"),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(RecipeError, match=message):
        resolve(TINY, env)


def test_every_table_variable_is_listed_and_unique() -> None:
    names = [name for name, _, _ in table_variables()]
    assert len(names) == len(set(names))
    assert set(names) <= set(variables())


def test_calculator_args_keep_values_of_modelled_flags_only() -> None:
    argv = ["--num-layers", "4", "--lr", "1e-3", "--sequence-parallel", "--data-path", "0.5", "a", "0.5", "b"]
    assert calculator_args(argv) == ["--num-layers", "4", "--sequence-parallel"]


def test_shell_output_is_quoted_and_carries_the_exit_codes() -> None:
    env = {"PATH": "/usr/bin:/bin", "EXTRA_ARGS": "--seed 3", "CHECKPOINT_DIR": "/path with space/ckpt"}
    proc = subprocess.run(
        [sys.executable, "-m", "megatron_ext.cli.recipe", "--", *TINY],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=QUICK_S,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    script = proc.stdout + 'printf "%s\\n" "${pretrain_args[@]}"; echo "$EXIT_SAVED_AND_STOPPED $TRACKER_FILENAME"'
    shown = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, check=True, timeout=QUICK_S
    ).stdout.splitlines()
    assert "/path with space/ckpt" in shown
    assert shown[-1] == f"{int(ExitCode.SAVED_AND_STOPPED)} latest_checkpointed_iteration.txt"


def test_the_estimate_pads_the_vocabulary_of_the_run_s_own_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Before: a recipe with its own tokenizer was estimated with --vocab-size's vocabulary (50,257 for the GPT-3
    presets) while the run pads the tokenizer's."""
    model = shared_data(tmp_path_factory)["model"]
    tokenizer = ["--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model", str(model)]
    argv = ["--num-layers", "4", "--vocab-size", "50257", "--data-path", "/data/web", *tokenizer]
    assert calculator_args(argv) == ["--num-layers", "4", "--vocab-size", "50257", "--tokenizer-vocab-size", "1000"]
    # Mock data and the tokenizers --vocab-size sizes: nothing to read.
    assert calculator_args(["--vocab-size", "50257", "--mock-data", *tokenizer]) == ["--vocab-size", "50257"]
