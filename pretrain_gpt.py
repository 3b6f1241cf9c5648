#!/usr/bin/env python3
"""Pretrain a GPT with Megatron-Core: TP × interleaved-1F1B PP × DP.

The providers below say *what* is trained; ``megatron_ext.training.entry.pretrain``
does the rest. The same script rehearses a layout on CPU processes (gloo) and
trains on GPUs (NCCL):

    torchrun --nproc-per-node 4 pretrain_gpt.py --mock-data --device cpu \
        --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1 ...
"""

from __future__ import annotations

import sys
from functools import partial
from typing import TYPE_CHECKING, Any

from megatron_ext.training.entry import pretrain

# torch and the runtime are imported inside the providers, which only training calls: --dry-run imports neither.
if TYPE_CHECKING:
    import torch

    from megatron_ext.config.training_config import TrainingConfig
    from megatron_ext.data.tokenizer_base import Tokenizer
    from megatron_ext.training.datasets import Datasets


def model_provider(
    cfg: TrainingConfig,
    *,
    pre_process: bool,
    post_process: bool,
    vp_stage: int | None,
    device: torch.device,
) -> torch.nn.Module:
    """One GPT model chunk (the layers of one virtual pipeline stage)."""
    from megatron_ext.training.model import gpt_model

    return gpt_model(cfg, pre_process=pre_process, post_process=post_process, vp_stage=vp_stage, device=device)


def loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor) -> tuple[Any, ...]:
    """Sum of per-token losses and the token count; the schedule averages.

    Returns (loss sum, tokens, {"lm loss": [sum, tokens]}) so that reported
    losses are exact token means over the global batch.
    """
    import torch

    losses = output_tensor.float().view(-1)  # (b·s,)
    mask = loss_mask.view(-1).float()
    loss = torch.sum(losses * mask)
    num_tokens = mask.sum().to(torch.int)
    report = torch.stack([loss.detach(), num_tokens.detach().float()])
    return loss, num_tokens, {"lm loss": report}


def forward_step(data_iterator: Any, model: torch.nn.Module) -> tuple[torch.Tensor, Any]:
    """Run one micro-batch through one model chunk."""
    from megatron.core import parallel_state
    from megatron.core.utils import get_batch_on_this_cp_rank

    from megatron_ext.training.model import unwrap
    from megatron_ext.training.packed_documents import pack_documents

    chunk = unwrap(model)
    batch: Any = {}
    packed_seq_params = None
    # Middle chunks read the batch only for the documents' mask or boundaries (--reset-attention-mask,
    # --dataloader-inter-document-masking).
    if data_iterator is not None:
        # Packed documents: the micro-batch as one (1, b·s) sequence and its boundaries (as Megatron-LM).
        batch, packed_seq_params = pack_documents(next(data_iterator), next(model.parameters()).device)
        # Context parallelism: this rank's two of the sequence's 2·CP chunks (a no-op without).
        # Megatron-Core 0.19: is_hybrid_cp is required, and cp_group=None means the WORLD group (0.16: parallel_state's).
        batch = get_batch_on_this_cp_rank(
            batch,
            is_hybrid_cp=False,
            cp_group=parallel_state.get_context_parallel_group(),
            use_per_sequence_balancing=packed_seq_params is not None,  # as Megatron-LM (CP 1 here: no split)
        )
    tokens = batch["tokens"] if chunk.pre_process else None
    position_ids = batch["position_ids"] if chunk.pre_process else None
    labels = batch["labels"] if chunk.post_process else None
    attention_mask = batch.get("attention_mask")  # (b, 1, s, s), True: not attended
    # (b, s) token ids in; on the last stage (b, s) per-token losses out.
    output = model(tokens, position_ids, attention_mask, labels=labels, packed_seq_params=packed_seq_params)
    loss_mask: Any = batch["loss_mask"] if chunk.post_process else None
    return output, partial(loss_func, loss_mask)


def datasets_provider(cfg: TrainingConfig, tokenizer: Tokenizer) -> Datasets:
    """Train / valid / test datasets (Megatron-Core's builders) with the run's tokenizer."""
    from megatron_ext.training.datasets import build_datasets

    return build_datasets(cfg, tokenizer)


if __name__ == "__main__":
    sys.exit(pretrain(model_provider=model_provider, forward_step=forward_step, datasets_provider=datasets_provider))
