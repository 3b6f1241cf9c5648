"""--use-checkpoint-args takes what Megatron-LM's load_args_from_checkpoint takes: sizes only where the command line
leaves them unset, architecture switches always, tokenizer and parallel sizes by their switches."""

from __future__ import annotations

import pytest

from megatron_ext.config.arguments import ConfigError
from megatron_ext.config.checkpoint_args import with_checkpoint_args
from megatron_ext.config.training_config import parse_args

pytestmark = pytest.mark.unit

SAVED = {
    "model": {"num_layers": 8, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32, "ffn_hidden_size": None,
              "swiglu": True, "normalization": "RMSNorm", "hidden_dropout": 0.0, "position_embedding_type": "rope",
              "vocab_size": 255},
    "parallel": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 1},
    "data": {"tokenizer_type": "GPTSentencePieceTokenizer", "tokenizer_model": "/ckpt/sp.model"},
}  # fmt: skip


def test_sizes_fill_what_is_not_given_and_switches_always_come_from_the_checkpoint() -> None:
    given = {"model": {"num_layers": 4, "hidden_dropout": 0.3}, "parallel": {}, "data": {}, "run": {}}
    merged, changed = with_checkpoint_args(given, SAVED, tokenizer=True, parallel=False)
    m = merged["model"]
    assert m["num_layers"] == 4 and m["hidden_size"] == 64  # given wins; the rest from the checkpoint
    assert m["hidden_dropout"] == 0.0 and m["swiglu"] and m["normalization"] == "RMSNorm"  # forced
    assert "ffn_hidden_size" not in m and "vocab_size" not in m  # None is skipped; not one Megatron-LM takes
    assert merged["data"]["tokenizer_model"] == "/ckpt/sp.model" and merged["parallel"] == {}
    assert "num_layers=4" not in changed and "hidden_size=64" in changed
    kept, _ = with_checkpoint_args(given, SAVED, tokenizer=False, parallel=True)
    assert kept["data"] == {} and kept["parallel"]["tensor_model_parallel_size"] == 2


def test_the_flags_need_load_and_each_other() -> None:
    with pytest.raises(ConfigError, match="--use-checkpoint-args takes the model's flags from the checkpoint"):
        parse_args(["--mock-data", "--use-checkpoint-args"])
    with pytest.raises(ConfigError, match="apply with --use-checkpoint-args only"):
        parse_args(["--mock-data", "--use-mp-args-from-checkpoint-args", "--load", "x"])
    cfg = parse_args(["--mock-data", "--use-checkpoint-args", "--load", "x", "--vocab-size", "255"],
                     checkpoint_args={k: v for k, v in SAVED.items() if k != "data"})  # fmt: skip
    assert (cfg.model.num_layers, cfg.model.swiglu, cfg.model.position_embedding_type) == (8, True, "rope")
    assert cfg.adjustments[0].startswith("--use-checkpoint-args: from x: num_layers=8, hidden_size=64")
