"""Core attention for Megatron-Core's local layer spec on PyTorch's SDPA kernels.

Without Transformer Engine, Megatron-Core's local spec computes attention
with ``DotProductAttention``: it materialises the ``[b, n, s, s]`` score
matrix, applies a (possibly unfused) masked softmax and dropout to it, and
multiplies again. ``SDPAttention`` replaces only that core with
``torch.nn.functional.scaled_dot_product_attention``, which picks the flash
or memory-efficient kernel on GPU (no ``s × s`` matrix in memory) and a fused
math kernel on CPU. Everything around it (QKV projection, rotary embedding,
output projection, tensor-parallel head split) stays Megatron-Core's.

It is a drop-in for ``DotProductAttention``: same constructor, same
``forward(query, key, value, attention_mask, ...)`` with ``[s, b, heads, d]``
inputs and a ``[s, b, heads·d]`` output, same softmax scale, causal masking
when no mask is given, Megatron's boolean mask convention (``True`` =
masked out) otherwise, grouped-query attention without repeating keys and
values, and dropout drawn inside the tensor-parallel RNG region (as
Megatron-Core does) so that tensor-parallel ranks drop different heads.

Packed sequences (``--dataloader-inter-document-masking``) come in Megatron-Core's THD form, ``[t, heads, d]``
with the documents' ``cu_seqlens``; each document attends within itself, one SDPA call per document.

``--attention-backend`` picks the kernel: ``auto`` lets PyTorch choose,
``flash`` / ``fused`` (memory-efficient) / ``unfused`` (math) restrict it,
and ``local`` keeps Megatron-Core's own ``DotProductAttention``.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import weakref
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.transformer.module import MegatronModule
from torch import Tensor

_KERNELS = {
    "flash": "FLASH_ATTENTION",
    "fused": "EFFICIENT_ATTENTION",
    "unfused": "MATH",
}
"""``--attention-backend`` value → ``torch.nn.attention.SDPBackend`` member."""


def sdpa_kernels(backend: str) -> list[Any] | None:
    """The SDPA kernels ``--attention-backend`` allows (None: PyTorch chooses)."""
    if backend not in _KERNELS:
        return None
    from torch.nn.attention import SDPBackend

    return [getattr(SDPBackend, _KERNELS[backend])]


class SDPAttention(MegatronModule):
    """``DotProductAttention`` computed by ``scaled_dot_product_attention``.

    Shapes (per tensor-parallel rank): query ``[sq, b, np, hn]``, key and
    value ``[sk, b, ng, hn]`` with ``np`` heads and ``ng`` query groups on this
    rank; output ``[sq, b, np·hn]``.
    """

    def __init__(
        self,
        config: Any,
        layer_number: int,
        attn_mask_type: Any,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: Any = None,
        *,
        kernels: list[Any] | None = None,
    ) -> None:
        from megatron.core.process_groups_config import ProcessGroupCollection
        from megatron.core.utils import divide

        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError("SDPAttention does not support context parallelism; use Transformer Engine")
        if config.window_size is not None:
            raise ValueError("SDPAttention does not support sliding-window attention; use --attention-backend local")
        if config.softmax_type != "vanilla":
            raise ValueError(f"SDPAttention supports only the vanilla softmax, not {config.softmax_type!r}")
        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        self.attention_type = attention_type
        if pg_collection is None:
            pg_collection = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp"])
        tp_size = pg_collection.tp.size()
        projection = config.kv_channels * config.num_attention_heads
        self.hidden_size_per_partition = divide(projection, tp_size)
        self.heads_per_partition = divide(config.num_attention_heads, tp_size)
        self.groups_per_partition = divide(config.num_query_groups, tp_size)
        head_dim = divide(projection, config.num_attention_heads)
        # apply_query_key_layer_scaling divides and re-multiplies by the layer
        # number in Megatron's softmax; the net scale is the same.
        self.softmax_scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else softmax_scale
        self.dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout
        self.kernels = kernels

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        attn_mask_type: Any = None,
        attention_bias: Tensor | None = None,
        packed_seq_params: Any = None,
    ) -> Tensor:
        from megatron.core.transformer.enums import AttnMaskType

        if attention_bias is not None:
            raise ValueError("SDPAttention does not support an attention bias")
        mask_type = self.attn_mask_type if attn_mask_type is None else attn_mask_type
        if packed_seq_params is not None:
            return self._packed(query, key, value, attention_mask, mask_type, packed_seq_params)
        return self._attend(query, key, value, attention_mask, causal=mask_type == AttnMaskType.causal)

    def _packed(
        self, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, mask_type: Any, params: Any
    ) -> Tensor:
        """Packed sequences in Megatron-Core's THD form (``--dataloader-inter-document-masking``): query ``[t, np,
        hn]``, key and value ``[t, ng, hn]`` holding the documents ``cu_seqlens`` bounds; each attends within
        itself, causally, as Transformer Engine's THD attention does. Output ``[t, 1, np·hn]``."""
        from megatron.core.transformer.enums import AttnMaskType

        if params.qkv_format != "thd":
            raise ValueError(f"SDPAttention takes packed sequences in the THD form, not {params.qkv_format!r}")
        if params.cu_seqlens_q_padded is not None or params.cu_seqlens_kv_padded is not None:
            raise ValueError("SDPAttention does not support padded packed sequences (cu_seqlens_*_padded)")
        if params.cu_seqlens_q is not params.cu_seqlens_kv or attention_mask is not None:
            raise ValueError("SDPAttention attends packed documents to themselves: one cu_seqlens and no mask")
        bounds = _document_bounds(params.cu_seqlens_q)
        if bounds[0] != 0 or bounds[-1] != query.shape[0]:
            raise ValueError(f"cu_seqlens {bounds[0]}..{bounds[-1]} do not span the {query.shape[0]} packed tokens")
        causal = mask_type == AttnMaskType.causal
        # One document at a time, as a batch of one: no t × t mask in memory.
        parts = [
            self._attend(query[a:b].unsqueeze(1), key[a:b].unsqueeze(1), value[a:b].unsqueeze(1), None, causal=causal)
            for a, b in itertools.pairwise(bounds)
            if b > a
        ]
        return torch.cat(parts)

    def _attend(
        self, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, *, causal: bool
    ) -> Tensor:
        """Attention over ``[s, b, heads, d]`` inputs; causal (when ``causal`` and no mask) or by Megatron's mask."""
        from megatron.core import tensor_parallel

        sq, b = query.shape[0], query.shape[1]
        sk = key.shape[0]
        # [s, b, heads, d] -> [b, heads, s, d]: a view; the last dim stays contiguous.
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        mask = None
        if attention_mask is not None:
            # Megatron: True means "do not attend"; SDPA: True means "attend".
            mask = ~attention_mask if attention_mask.dtype == torch.bool else attention_mask
            causal = False
        elif causal and sq > 1:
            if sq != sk:
                raise ValueError(f"causal self-attention needs equal query and key lengths, got {sq} and {sk}")
        else:
            causal = False

        gqa = self.heads_per_partition != self.groups_per_partition
        if gqa and not self.native_gqa(q, mask):
            # [b, ng, s, d] -> [b, np, s, d], as DotProductAttention does.
            repeat = self.heads_per_partition // self.groups_per_partition
            k, v = (t.repeat_interleave(repeat, dim=1) for t in (k, v))
            gqa = False
        dropout = self.dropout_p if self.training else 0.0
        kwargs = {
            "attn_mask": mask,
            "dropout_p": dropout,
            "is_causal": causal,
            "scale": self.softmax_scale,
            "enable_gqa": gqa,
        }
        with _kernel_choice(self.kernels):
            if dropout > 0.0 and not self.config.sequence_parallel:
                # As DotProductAttention: heads are split over TP ranks, so each
                # rank drops from its own stream.
                with tensor_parallel.get_cuda_rng_tracker().fork():
                    context = F.scaled_dot_product_attention(q, k, v, **kwargs)
            else:
                context = F.scaled_dot_product_attention(q, k, v, **kwargs)
        # [b, np, sq, hn] -> [sq, b, np·hn]
        return context.permute(2, 0, 1, 3).reshape(sq, b, self.hidden_size_per_partition)

    def native_gqa(self, query: Tensor, mask: Tensor | None) -> bool:
        """Whether SDPA gets the key/value groups as they are (``enable_gqa``).

        Only PyTorch's flash kernel implements ``enable_gqa``; with any other
        kernel the flag sends the call to the slow math kernel, so where flash
        cannot run (fp32, an explicit mask, another kernel chosen, no GPU) the
        groups are repeated instead and the fused kernels stay usable.
        """
        flash_allowed = self.kernels is None or self.kernels == sdpa_kernels("flash")
        half = query.dtype in (torch.float16, torch.bfloat16)
        return query.is_cuda and half and mask is None and flash_allowed


_last_bounds: tuple[weakref.ref[Tensor], list[int]] | None = None
"""The last micro-batch's ``cu_seqlens`` and its Python ints: read once (one device-to-host copy) for all the
layers that attend over it, not once per layer."""


def _document_bounds(cu_seqlens: Tensor) -> list[int]:
    global _last_bounds
    if _last_bounds is None or _last_bounds[0]() is not cu_seqlens:
        _last_bounds = (weakref.ref(cu_seqlens), cu_seqlens.tolist())
    return _last_bounds[1]


def _kernel_choice(kernels: list[Any] | None) -> Any:
    if kernels is None:
        return contextlib.nullcontext()
    from torch.nn.attention import sdpa_kernel

    return sdpa_kernel(kernels)
