"""``--reset-attention-mask``: documents packed into one sequence do not attend to each other.

A real GPTModel of the local spec in one CPU process, fed a sequence of two documents with the attention mask and
position ids that Megatron-Core's GPTDataset builds for it (``_get_ltor_masks_and_position_ids``): the second
document's logits do not change when the first one does, with either core attention (SDPA and Megatron-Core's
``DotProductAttention``); without the mask they do. The pipeline (middle stages read the mask too) is checked by
a training run on real documents in ``tests/training/test_train_on_indexed.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from megatron_ext.config.arguments import ConfigError
from megatron_ext.config.training_config import parse_args

pytestmark = pytest.mark.distributed  # a one-process gloo group for Megatron-Core's parallel state

FLAGS = (
    "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --max-position-embeddings 16 "
    "--micro-batch-size 1 --global-batch-size 1 --vocab-size 63 --mock-data --device cpu --hidden-dropout 0 "
    "--attention-dropout 0 --reset-attention-mask --reset-position-ids"
).split()
EOD = 63  # the null tokenizer's end of document: --vocab-size (a 64-token vocabulary with it)
FIRST = 6  # the first document's length, its end-of-document token included


def _logits(backend: str, tokens: torch.Tensor, *, masked: bool) -> torch.Tensor:
    from megatron.core.datasets.gpt_dataset import _get_ltor_masks_and_position_ids

    from megatron_ext.training.model import gpt_model

    cfg = parse_args([*FLAGS, "--attention-backend", backend], world_size=1)
    assert cfg.data.document_attention_mask
    torch.manual_seed(0)
    model = gpt_model(cfg, pre_process=True, post_process=True, vp_stage=None, device=torch.device("cpu")).eval()
    mask, _, positions = _get_ltor_masks_and_position_ids(
        tokens[0], EOD, reset_position_ids=True, reset_attention_mask=True, eod_mask_loss=False, create_attention_mask=True
    )  # fmt: skip
    with torch.no_grad():
        out: Any = model(tokens, positions.unsqueeze(0), mask.unsqueeze(0) if masked else None)
    return out[0, FIRST:]  # the second document's positions


@pytest.mark.parametrize("backend", ["auto", "local"])
def test_a_tokens_logits_do_not_depend_on_the_previous_document(parallel_state: None, backend: str) -> None:
    second = torch.arange(1, 1 + 16 - FIRST)
    tokens = torch.cat([torch.tensor([5, 9, 2, 7, 11, EOD]), second]).unsqueeze(0)
    other = torch.cat([torch.tensor([40, 3, 3, 17, 28, EOD]), second]).unsqueeze(0)
    assert torch.equal(_logits(backend, tokens, masked=True), _logits(backend, other, masked=True))
    # The test can fail: without the mask the second document sees the first.
    assert not torch.allclose(_logits(backend, tokens, masked=False), _logits(backend, other, masked=False))


def test_the_dataset_builds_the_mask_only_when_asked() -> None:
    from megatron_ext.data.tokenizers import NullTokenizer
    from megatron_ext.training.datasets import dataset_config

    tokenizer = NullTokenizer(63)
    on = dataset_config(parse_args(FLAGS, world_size=1), tokenizer)
    assert on.reset_attention_mask and on.create_attention_mask
    # Megatron-LM's --no-create-attention-mask-in-dataloader wins: no mask, documents attend to each other.
    off = dataset_config(parse_args([*FLAGS, "--no-create-attention-mask-in-dataloader"], world_size=1), tokenizer)
    assert not off.reset_attention_mask and not off.create_attention_mask
    plain = dataset_config(parse_args(FLAGS[:-2], world_size=1), tokenizer)
    assert not plain.create_attention_mask


def test_transformer_engines_attention_is_refused_naming_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    from megatron_ext.training import model

    cfg = parse_args(FLAGS, world_size=1)
    monkeypatch.setattr(model, "use_transformer_engine", lambda cfg, device: True)
    with pytest.raises(ConfigError, match=r"ignores the per-document mask .* give --transformer-impl local"):
        model.check_transformer_engine(cfg, torch.device("cuda"))
