"""What a checkpoint's common state says of the run that wrote it (``checkpoint/records.py``), read in today's
meaning of its flags."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from megatron_ext.checkpoint import records
from megatron_ext.config.training_config import make_config

pytestmark = pytest.mark.unit


def _common(*, tokenizer: str, flag: int, trained: int, eod_id: int | None = None) -> dict[str, Any]:
    cfg = make_config(
        world_size=1,
        model={"num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 32, "vocab_size": flag},
        data={"mock_data": True, "tokenizer_type": tokenizer, "null_tokenizer_eod_id": eod_id}
        | ({"tokenizer_model": "vocab.json", "tiktoken_pattern": "v2"} if tokenizer == "TikTokenizer" else {}),
    )
    common = records.common_state(cfg, iteration=3, consumed_samples=24, identity=None)
    return common | {"vocab_size": trained}


def test_a_null_tokenizer_checkpoint_of_the_earlier_meaning_reads_as_the_flag_that_trains_it_now() -> None:
    """Before Megatron-LM 0.17, --vocab-size 255 trained 256 ids (end of document 255): --vocab-size 256 now."""
    earlier = _common(tokenizer="NullTokenizer", flag=255, trained=256)
    assert records.null_vocabulary_before_0_17(earlier) == 256
    args = records.arguments_of(earlier)
    assert args is not None and args["model"]["vocab_size"] == 256
    assert earlier["args"]["model"]["vocab_size"] == 255  # the record itself is left as it is
    saved = records.saved_run(Path("ckpt"), earlier)
    assert saved is not None and saved.config.vocab_size == 256


@pytest.mark.parametrize(
    ("tokenizer", "flag", "trained", "eod_id"),
    [
        ("NullTokenizer", 256, 256, None),  # today's meaning
        ("NullTokenizer", 255, 256, 3),  # an explicit end of document: today's flag
        ("TikTokenizer", 255, 256, None),  # --vocab-size of another tokenizer
    ],
)
def test_any_other_checkpoint_reads_as_recorded(tokenizer: str, flag: int, trained: int, eod_id: int | None) -> None:
    common = _common(tokenizer=tokenizer, flag=flag, trained=trained, eod_id=eod_id)
    assert records.null_vocabulary_before_0_17(common) is None
    assert records.arguments_of(common) is common["args"]
    assert records.arguments_of({"iteration": 3}) is None  # saved before the arguments were recorded
