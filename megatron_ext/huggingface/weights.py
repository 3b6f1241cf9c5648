"""Our checkpoint's tensors ↔ ``transformers``' weights, one rule per tensor, both directions from one table.

Our checkpoints (Megatron-Core's sharded state dict) hold each per-layer weight once for
all layers, under a layout-free key with a leading layer axis (``decoder.layers.…``
of shape [layers, …]). The rules below say which ``transformers`` tensors one
layer's slice becomes, and how to join them back, so that import ∘ export is the
identity bit for bit:

- Megatron's fused QKV interleaves the query groups: for each group g, its
  query heads, then its key head, then its value head ([q_g, k_g, v_g] rows).
  Llama keeps separate ``q_proj``/``k_proj``/``v_proj``; GPT-2 one ``c_attn``
  with all queries, then all keys, then all values.
- Megatron's SwiGLU ``linear_fc1`` is [gate; up] (the first half goes through SiLU).
- GPT-2's ``Conv1D`` stores weights as [in, out], the transpose of a Linear's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from megatron_ext.config.arguments import ModelArgs
from megatron_ext.huggingface.architectures import GPT2, ROTARY, architecture

LAYERS = "decoder.layers."
"""Prefix of the keys with a leading layer axis."""


@dataclass(frozen=True)
class Rule:
    """One tensor of our checkpoint and the ``transformers`` tensors it becomes."""

    key: str
    """Our key (a per-layer one starts with ``LAYERS``)."""
    names: Callable[[int], list[str]]
    """The ``transformers`` names, for a layer (ignored for a tensor outside the layers)."""
    split: Callable[[torch.Tensor], list[torch.Tensor]]
    """Our tensor (one layer's slice) → the ``transformers`` tensors, in ``names`` order."""
    join: Callable[[list[torch.Tensor]], torch.Tensor]
    """The inverse of ``split``."""

    @property
    def per_layer(self) -> bool:
        return self.key.startswith(LAYERS)


def _same(t: torch.Tensor) -> list[torch.Tensor]:
    return [t]


def _first(ts: list[torch.Tensor]) -> torch.Tensor:
    return ts[0]


def _transposed(t: torch.Tensor) -> list[torch.Tensor]:
    return [t.t()]


def _untransposed(ts: list[torch.Tensor]) -> torch.Tensor:
    return ts[0].t()


@dataclass(frozen=True)
class _Heads:
    """Megatron's fused QKV rows: ``groups`` query groups of ``per_group`` query heads of ``dim`` rows."""

    heads: int
    groups: int
    dim: int

    @property
    def per_group(self) -> int:
        return self.heads // self.groups

    def split(self, t: torch.Tensor) -> list[torch.Tensor]:
        """[q_g, k_g, v_g] per group → all queries, all keys, all values."""
        rest = t.shape[1:]
        g = t.reshape(self.groups, self.per_group + 2, self.dim, *rest)
        q = g[:, : self.per_group].reshape(self.heads * self.dim, *rest)
        k = g[:, self.per_group].reshape(self.groups * self.dim, *rest)
        v = g[:, self.per_group + 1].reshape(self.groups * self.dim, *rest)
        return [q, k, v]

    def join(self, ts: list[torch.Tensor]) -> torch.Tensor:
        q, k, v = ts
        rest = q.shape[1:]
        parts = [
            q.reshape(self.groups, self.per_group, self.dim, *rest),
            k.reshape(self.groups, 1, self.dim, *rest),
            v.reshape(self.groups, 1, self.dim, *rest),
        ]
        return torch.cat(parts, dim=1).reshape((self.heads + 2 * self.groups) * self.dim, *rest)


def _halves(t: torch.Tensor) -> list[torch.Tensor]:
    gate, up = torch.chunk(t, 2, dim=0)
    return [gate, up]


def _cat(ts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(ts, dim=0)


def rules(model: ModelArgs) -> list[Rule]:
    """Every tensor of ``model``'s checkpoint and its ``transformers`` counterparts (ConversionError if the
    model has no ``transformers`` architecture)."""
    arch = architecture(model)
    heads = _Heads(model.num_attention_heads, model.effective_num_query_groups, model.effective_kv_channels)
    bias = not model.disable_bias_linear
    qkv_bias = bias or model.add_qkv_bias  # Qwen2: on the query, key and value projections only
    tied = not model.untie_embeddings_and_output_weights
    out: list[Rule] = []

    def add(
        key: str,
        names: Callable[[int], list[str]],
        split: Callable[[torch.Tensor], list[torch.Tensor]] = _same,
        join: Callable[[list[torch.Tensor]], torch.Tensor] = _first,
    ) -> None:
        out.append(Rule(key, names, split, join))

    if arch in ROTARY:  # Llama, Qwen2, Qwen3 and Mistral name their weights alike
        p = "model.layers.{}."

        def layer(*suffixes: str) -> Callable[[int], list[str]]:
            return lambda i: [p.format(i) + s for s in suffixes]

        add("embedding.word_embeddings.weight", lambda i: ["model.embed_tokens.weight"])
        add(LAYERS + "self_attention.linear_qkv.layer_norm_weight", layer("input_layernorm.weight"))
        qkv = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
        add(LAYERS + "self_attention.linear_qkv.weight", layer(*(n + ".weight" for n in qkv)), heads.split, heads.join)
        if qkv_bias:
            add(LAYERS + "self_attention.linear_qkv.bias", layer(*(n + ".bias" for n in qkv)), heads.split, heads.join)
        add(LAYERS + "self_attention.linear_proj.weight", layer("self_attn.o_proj.weight"))
        if model.qk_layernorm:  # Qwen3: one RMSNorm over the head dimension, shared by the heads
            add(LAYERS + "self_attention.q_layernorm.weight", layer("self_attn.q_norm.weight"))
            add(LAYERS + "self_attention.k_layernorm.weight", layer("self_attn.k_norm.weight"))
        add(LAYERS + "mlp.linear_fc1.layer_norm_weight", layer("post_attention_layernorm.weight"))
        add(LAYERS + "mlp.linear_fc1.weight", layer("mlp.gate_proj.weight", "mlp.up_proj.weight"), _halves, _cat)
        add(LAYERS + "mlp.linear_fc2.weight", layer("mlp.down_proj.weight"))
        if bias:
            add(LAYERS + "self_attention.linear_proj.bias", layer("self_attn.o_proj.bias"))
            add(LAYERS + "mlp.linear_fc1.bias", layer("mlp.gate_proj.bias", "mlp.up_proj.bias"), _halves, _cat)
            add(LAYERS + "mlp.linear_fc2.bias", layer("mlp.down_proj.bias"))
        add("decoder.final_layernorm.weight", lambda i: ["model.norm.weight"])
    else:
        assert arch == GPT2
        p = "transformer.h.{}."

        def layer(*suffixes: str) -> Callable[[int], list[str]]:
            return lambda i: [p.format(i) + s for s in suffixes]

        def c_attn_split(t: torch.Tensor) -> list[torch.Tensor]:
            return [torch.cat(heads.split(t), dim=0).t()]

        def c_attn_join(ts: list[torch.Tensor]) -> torch.Tensor:
            return heads.join(list(torch.chunk(ts[0].t(), 3, dim=0)))

        def bias_split(t: torch.Tensor) -> list[torch.Tensor]:
            return [torch.cat(heads.split(t), dim=0)]

        def bias_join(ts: list[torch.Tensor]) -> torch.Tensor:
            return heads.join(list(torch.chunk(ts[0], 3, dim=0)))

        add("embedding.word_embeddings.weight", lambda i: ["transformer.wte.weight"])
        add("embedding.position_embeddings.weight", lambda i: ["transformer.wpe.weight"])
        add(LAYERS + "self_attention.linear_qkv.layer_norm_weight", layer("ln_1.weight"))
        add(LAYERS + "self_attention.linear_qkv.layer_norm_bias", layer("ln_1.bias"))
        add(LAYERS + "self_attention.linear_qkv.weight", layer("attn.c_attn.weight"), c_attn_split, c_attn_join)
        add(LAYERS + "self_attention.linear_qkv.bias", layer("attn.c_attn.bias"), bias_split, bias_join)
        add(LAYERS + "self_attention.linear_proj.weight", layer("attn.c_proj.weight"), _transposed, _untransposed)
        add(LAYERS + "self_attention.linear_proj.bias", layer("attn.c_proj.bias"))
        add(LAYERS + "mlp.linear_fc1.layer_norm_weight", layer("ln_2.weight"))
        add(LAYERS + "mlp.linear_fc1.layer_norm_bias", layer("ln_2.bias"))
        add(LAYERS + "mlp.linear_fc1.weight", layer("mlp.c_fc.weight"), _transposed, _untransposed)
        add(LAYERS + "mlp.linear_fc1.bias", layer("mlp.c_fc.bias"))
        add(LAYERS + "mlp.linear_fc2.weight", layer("mlp.c_proj.weight"), _transposed, _untransposed)
        add(LAYERS + "mlp.linear_fc2.bias", layer("mlp.c_proj.bias"))
        add("decoder.final_layernorm.weight", lambda i: ["transformer.ln_f.weight"])
        add("decoder.final_layernorm.bias", lambda i: ["transformer.ln_f.bias"])
    if not tied:
        add("output_layer.weight", lambda i: ["lm_head.weight"])
    return out


def is_model_tensor(key: str) -> bool:
    """Whether a checkpoint key is a model weight (not optimizer state, RNG or a module's extra state)."""
    return not key.startswith(("optimizer.", "rng_state")) and not key.endswith("_extra_state")
