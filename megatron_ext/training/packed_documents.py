"""``--dataloader-inter-document-masking``: a micro-batch's documents as one packed (THD) sequence.

Megatron-Core's ``GPTDataset`` (``inter_document_masking``) gives each sample its documents' boundaries,
``cu_seqlens`` (right-padded to ``s + 1`` entries so that samples stack) and the longest document, ``max_seqlen``,
with position ids restarting at each document. As Megatron-LM's ``pretrain_gpt.py`` does, the ``b`` samples of a
micro-batch become one sequence of ``b·s`` tokens (Megatron-Core's ``flatten_batch_for_packed_sequences``) and the
boundaries reach the attention as Megatron-Core's ``PackedSeqParams`` in the THD form: Transformer Engine's
attention and ``SDPAttention`` (``training/attention.py``) attend within each document, and the rotary embedding
restarts at each.
"""

from __future__ import annotations

from typing import Any

import torch


def pack_documents(batch: dict[str, Any], device: torch.device) -> tuple[dict[str, Any], Any]:
    """``batch`` on ``device``, flattened to one ``(1, b·s)`` sequence, and its ``PackedSeqParams``; a batch
    without ``cu_seqlens`` comes back as it is (moved), with None."""
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.utils import flatten_batch_for_packed_sequences

    batch = {
        key: value.to(device, non_blocking=True) if torch.is_tensor(value) else value for key, value in batch.items()
    }
    if batch.get("cu_seqlens") is None:
        return batch, None
    seq_length = batch["tokens"].shape[1]
    batch = flatten_batch_for_packed_sequences(batch)
    cu_seqlens = batch["cu_seqlens"].squeeze(0)  # (documents + 1,) int32, ending at b·s
    max_seqlen = int(batch["max_seqlen"].item())
    params = PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu_seqlens,
        cu_seqlens_kv=cu_seqlens,
        max_seqlen_q=max_seqlen,
        max_seqlen_kv=max_seqlen,
        tokens_per_sample=seq_length,  # Megatron-Core reads it for MoE only; set as Megatron-LM sets it
    )
    return batch, params
