"""``--dataloader-inter-document-masking``: documents packed into one sequence attend as separate sequences.

A real GPTModel of the local spec (SDPA) in one CPU process is fed a micro-batch of two samples holding five
documents, in the form Megatron-Core's GPTDataset gives them (``cu_seqlens`` right-padded to ``s + 1``,
``max_seqlen``, positions restarting per document), packed by ``training/packed_documents.py``: each document's
logits are those of the document fed alone, with rotary and with learned positions, with grouped-query attention.
Transformer Engine is mocked where it would take the packed sequences (``pretrain_gpt.py``'s ``forward_step``
hands them over as Megatron-LM does). Training under PP2 × VP2 is checked in ``tests/training/test_train_on_indexed.py``.
"""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path
from typing import Any

import pytest
import torch

from megatron_ext.config.arguments import ConfigError
from megatron_ext.config.training_config import parse_args

pytestmark = pytest.mark.distributed  # a one-process gloo group for Megatron-Core's parallel state

S = 16
FLAGS = (
    f"--num-layers 2 --hidden-size 32 --num-attention-heads 4 --group-query-attention --num-query-groups 2 "
    f"--seq-length {S} --max-position-embeddings {S} --micro-batch-size 2 --global-batch-size 2 --vocab-size 63 "
    "--mock-data --device cpu --hidden-dropout 0 --attention-dropout 0 --dataloader-inter-document-masking"
).split()
DOCUMENTS = ([6, 10], [3, 5, 8])  # per sample: its documents' lengths (each sample holds S tokens)


def _dataset_batch() -> dict[str, torch.Tensor]:
    """Two samples as Megatron-Core's GPTDataset (inter_document_masking) gives them, collated."""
    rows = []
    for lengths in DOCUMENTS:
        bounds = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        cu_seqlens = torch.full((S + 1,), S, dtype=torch.int32)  # the dataset's right padding: copies of s
        cu_seqlens[: bounds.numel()] = bounds
        positions = torch.cat([torch.arange(n) for n in lengths])
        rows.append((cu_seqlens, positions, max(lengths)))
    tokens = torch.randint(0, 63, (2, S), generator=torch.Generator().manual_seed(1))
    return {
        "tokens": tokens,
        "labels": tokens.roll(-1, dims=1),
        "loss_mask": torch.ones(2, S),
        "position_ids": torch.stack([positions for _, positions, _ in rows]),
        "cu_seqlens": torch.stack([cu for cu, _, _ in rows]),
        "max_seqlen": torch.tensor([longest for _, _, longest in rows]),
    }


@pytest.mark.parametrize("positions", ["rope", "learned_absolute"])
def test_each_packed_documents_logits_are_its_own(parallel_state: None, positions: str) -> None:
    from megatron_ext.training.model import gpt_model
    from megatron_ext.training.packed_documents import pack_documents

    cfg = parse_args([*FLAGS, "--position-embedding-type", positions], world_size=1)
    torch.manual_seed(0)
    model = gpt_model(cfg, pre_process=True, post_process=True, vp_stage=None, device=torch.device("cpu")).eval()
    batch = _dataset_batch()
    packed, params = pack_documents(dict(batch), torch.device("cpu"))
    assert params.qkv_format == "thd" and params.max_seqlen_q == 10
    assert params.cu_seqlens_q.tolist() == [0, 6, 16, 19, 24, 32]  # the second sample's offset by s
    assert packed["tokens"].shape == (1, 2 * S)
    with torch.no_grad():
        out: Any = model(packed["tokens"], packed["position_ids"], None, packed_seq_params=params)
        bounds = params.cu_seqlens_q.tolist()
        for a, b in itertools.pairwise(bounds):
            alone = model(packed["tokens"][:, a:b], torch.arange(b - a).unsqueeze(0), None)
            torch.testing.assert_close(out[0, a:b], alone[0], rtol=1e-5, atol=1e-5)
        # The test can fail: unpacked, the second document of the first sample sees the first document.
        whole = model(batch["tokens"], batch["position_ids"], None)
    assert not torch.allclose(whole[0, 6:S], out[0, 6:S], atol=1e-3)


def test_the_dataset_gives_boundaries_and_no_mask() -> None:
    from megatron_ext.data.tokenizers import NullTokenizer
    from megatron_ext.training.datasets import dataset_config

    # Megatron-LM turns the mask off when the boundaries are given, --reset-attention-mask or not.
    cfg = parse_args([*FLAGS, "--reset-attention-mask"], world_size=1)
    config = dataset_config(cfg, NullTokenizer(63))
    assert config.inter_document_masking and not config.create_attention_mask
    assert not cfg.data.document_attention_mask and cfg.data.reads_every_stage
    plain = parse_args(FLAGS[:-1], world_size=1)
    assert not dataset_config(plain, NullTokenizer(63)).inter_document_masking and not plain.data.reads_every_stage


def test_what_cannot_attend_per_document_is_refused_naming_the_fix() -> None:
    with pytest.raises(
        ConfigError, match=r"DotProductAttention \(--attention-backend local\) .* --attention-backend auto"
    ):
        parse_args([*FLAGS, "--attention-backend", "local"], world_size=1)
    te = [a if a != "cpu" else "cuda" for a in FLAGS] + ["--transformer-impl", "transformer_engine"]
    with pytest.raises(ConfigError, match=r"--context-parallel-size 2: .* train with --context-parallel-size 1"):
        parse_args([*te, "--context-parallel-size", "2"], world_size=2)
    parse_args(te, world_size=1)  # Transformer Engine's attention takes them


class _RecordingModel(torch.nn.Module):
    """Stands in for a Transformer Engine GPTModel chunk: records what ``forward_step`` hands it."""

    def __init__(self, *, pre_process: bool, post_process: bool) -> None:
        super().__init__()
        self.pre_process, self.post_process = pre_process, post_process
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.calls: list[tuple[Any, ...]] = []

    def forward(self, tokens: Any, position_ids: Any, attention_mask: Any, **kwargs: Any) -> torch.Tensor:
        self.calls.append((tokens, position_ids, attention_mask, kwargs))
        return torch.zeros(1)


def _forward_step() -> Any:
    script = Path(__file__).resolve().parents[2] / "pretrain_gpt.py"
    spec = importlib.util.spec_from_file_location("pretrain_gpt_under_test", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.forward_step


def test_transformer_engines_attention_gets_the_packed_sequences(
    parallel_state: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from megatron_ext.training import model

    cfg = parse_args(FLAGS, world_size=1)
    monkeypatch.setattr(model, "use_transformer_engine", lambda cfg, device: True)
    model.check_transformer_engine(cfg, torch.device("cuda"))  # not refused, unlike the mask form
    forward_step = _forward_step()
    for pre_process, post_process in [(True, False), (False, False), (False, True)]:
        chunk = _RecordingModel(pre_process=pre_process, post_process=post_process)
        forward_step(iter([_dataset_batch()]), chunk)
        [(tokens, positions, mask, kwargs)] = chunk.calls
        params = kwargs["packed_seq_params"]  # a middle chunk gets the boundaries too
        assert params.qkv_format == "thd" and params.cu_seqlens_kv.tolist() == [0, 6, 16, 19, 24, 32]
        assert (params.max_seqlen_q, params.max_seqlen_kv, params.tokens_per_sample) == (10, 10, S)
        assert mask is None and (kwargs["labels"] is not None) == post_process
        assert (tokens is not None) == pre_process and (positions is not None) == pre_process
        if pre_process:
            assert tokens.shape == (1, 2 * S) and positions[0, 16:19].tolist() == [0, 1, 2]
