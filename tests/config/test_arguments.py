"""Command-line parsing: Megatron-LM flag names, defaults, contradictions."""

from __future__ import annotations

import re

import pytest

from megatron_ext.config.arguments import ConfigError
from megatron_ext.config.training_config import build_parser, pad_vocab_size, parse_args
from megatron_ext.parallel.layout import LayoutError

pytestmark = pytest.mark.unit

MEGATRON_FLAGS = "--num-layers --hidden-size --ffn-hidden-size --num-attention-heads --group-query-attention --num-query-groups --seq-length --max-position-embeddings --position-embedding-type --swiglu --normalization --untie-embeddings-and-output-weights --disable-bias-linear --tensor-model-parallel-size --sequence-parallel --pipeline-model-parallel-size --num-layers-per-virtual-pipeline-stage --virtual-pipeline-model-parallel-size --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather --micro-batch-size --global-batch-size --lr --min-lr --lr-warmup-iters --lr-decay-iters --lr-decay-style --weight-decay --adam-beta1 --adam-beta2 --clip-grad --bf16 --fp16 --seed --init-method-std --recompute-granularity --recompute-method --recompute-num-layers --train-iters --log-interval --eval-interval --eval-iters --save --load --save-interval --tensorboard-dir --mock-data --transformer-impl --metrics-file --dry-run --device".split()


def test_megatron_flag_names_exist() -> None:
    known = {s for action in build_parser()._actions for s in action.option_strings}
    assert sorted(set(MEGATRON_FLAGS) - known) == []


def test_parse_full_layout() -> None:
    cfg = parse_args(
        "--mock-data --num-layers 8 --hidden-size 128 --num-attention-heads 8 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 2 --micro-batch-size 2 --global-batch-size 16 --swiglu --use-distributed-optimizer --bf16".split(),
        world_size=8,
    )
    assert cfg.layout.dp == 2 and cfg.layout.vp == 2 and cfg.layout.num_microbatches == 4
    assert cfg.model.effective_ffn_hidden_size == 320  # int(4·128·2/3 / 64) · 64
    assert cfg.optim.bf16 and cfg.layout.use_distributed_optimizer
    assert cfg.optim.lr_decay_iters is None  # the decay defaults to the whole run (config.iterations.lr_steps)


def test_world_size_from_the_launcher_unless_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher's WORLD_SIZE reaches the layout through the caller (pretrain reads it); --world-size wins."""
    monkeypatch.setenv("WORLD_SIZE", "8")  # building a config reads no environment
    cfg = parse_args(["--mock-data", "--micro-batch-size", "1"], default_world_size=4)
    assert cfg.layout.world_size == 4 and cfg.layout.global_batch_size == 4
    cfg = parse_args(["--mock-data", "--world-size", "2"], default_world_size=4)
    assert cfg.layout.world_size == 2


def test_padded_vocab_follows_megatron() -> None:
    assert pad_vocab_size(50257, 128, 1) == 50304
    assert pad_vocab_size(50257, 128, 8) == 51200
    cfg = parse_args(
        "--mock-data --vocab-size 1000 --tensor-model-parallel-size 2 --num-attention-heads 4".split(),
        world_size=2,
    )
    assert cfg.padded_vocab_size == 1024  # 1001 tokens (null tokenizer adds EOD) → multiple of 256


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--mock-data", "--bf16", "--fp16"], "mutually exclusive"),
        (["--mock-data", "--recompute-granularity", "full"], "needs --recompute-method"),
        (["--mock-data", "--overlap-param-gather"], "needs --use-distributed-optimizer"),
        ([], "no training data"),
        (["--mock-data", "--group-query-attention"], "needs --num-query-groups"),
        ("--mock-data --hidden-size 30 --num-attention-heads 4".split(), "not divisible"),
        ("--mock-data --train-iters 4 --lr-warmup-iters 4".split(), "must be shorter than the decay"),
        ("--mock-data --transformer-impl transformer_engine --attention-backend local".split(), "contradicts"),
    ],
)
def test_contradictions_are_errors(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_args(argv, world_size=1)


def test_layout_errors_surface_from_parse() -> None:
    with pytest.raises(LayoutError, match=r"num_layers=6 is not divisible by pipeline\(4\)"):
        parse_args("--mock-data --num-layers 6 --pipeline-model-parallel-size 4".split(), world_size=4)


def test_help_is_field_docs() -> None:
    text = " ".join(build_parser().format_help().split())
    assert "Layers per virtual stage (even splits only): turns on the interleaved 1F1B schedule." in text


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ("--num-attention-heads 0", "--num-attention-heads must be at least 1, got 0"),
        ("--seq-length -1", "--seq-length must be at least 1, got -1"),
        ("--hidden-size 0", "--hidden-size must be at least 1, got 0"),
        ("--lr -1", "--lr must be greater than 0, got -1"),
        ("--lr 1e-4 --min-lr 1e-3", "--min-lr 0.001 is larger than --lr 0.0001; lower --min-lr"),
        ("--hidden-dropout 1.5", "--hidden-dropout must be less than 1, got 1.5"),
        ("--hidden-dropout 1.0", "--hidden-dropout must be less than 1, got 1"),  # zeroes every activation
        ("--attention-dropout 1", "--attention-dropout must be less than 1, got 1"),
        ("--attention-dropout -0.1", "--attention-dropout must be at least 0, got -0.1"),
        ("--max-position-embeddings 64 --seq-length 128", "raise it to 128 or more"),
        ("--train-iters -3", "--train-iters must be at least 0, got -3"),
        ("--adam-eps 0", "--adam-eps must be greater than 0, got 0"),
    ],
)
def test_out_of_range_values_are_named_with_the_flag(flags: str, message: str) -> None:
    """Each bound comes from the flag table, so pretrain_gpt.py, --dry-run and the calculator refuse alike."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_args(["--mock-data", *flags.split()])


def test_argparse_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["--mock-data", "--num-layers", "two"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: argument --num-layers: invalid int value: 'two'") and len(err.splitlines()) == 1
