"""Exact parameter counts of Megatron-Core's ``GPTModel``: the one home of the formula.

For hidden size ``h``, ``n`` heads of ``d`` channels, ``g`` query groups, MLP
width ``f`` and padded vocabulary ``V``, one transformer layer holds::

    QKV            h·(n·d + 2·g·d)        (+ n·d + 2·g·d bias)
    projection     n·d·h                  (+ h bias)
    MLP            h·f·(2 if SwiGLU) + f·h (+ f·(2 if SwiGLU) + h bias)
    two norms      2·h each for LayerNorm (weight and bias), h for RMSNorm

Biases exist unless ``--disable-bias-linear``. Tensor parallelism splits the
matrices, the column-parallel biases (QKV, fc1) and the vocabulary over ``t``
ranks; the norms and the row-parallel biases (projection, fc2) are replicated.
The first pipeline stage also holds the word embedding ``V·h`` (split by TP)
and, with learned positions, the position embedding; the last holds the final
norm and the output layer: its own ``V·h`` when untied, a copy of the word
embedding when tied and PP > 1. This is what ``--dry-run`` prints (checked
against the built model by ``tests/estimate/test_plan.py``) and what the
memory model charges.
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_ext.config.arguments import ModelArgs


@dataclass(frozen=True, kw_only=True)
class LayerParameters:
    """Parameters of one transformer layer, by how tensor parallelism treats them."""

    split: int
    """Matrices and column-parallel biases: each TP rank holds 1/TP of them."""
    replicated: int
    """Norms and row-parallel biases: every TP rank holds all of them."""

    @property
    def total(self) -> int:
        return self.split + self.replicated

    def per_rank(self, tp: int) -> int:
        return self.split // tp + self.replicated


def norm_parameters(model: ModelArgs) -> int:
    """One normalization layer: weight and bias for LayerNorm, weight only for RMSNorm."""
    return 2 * model.hidden_size if model.normalization == "LayerNorm" else model.hidden_size


def layer_parameters(model: ModelArgs) -> LayerParameters:
    """One transformer layer (see the module docstring)."""
    h, n, g, d = (
        model.hidden_size,
        model.num_attention_heads,
        model.effective_num_query_groups,
        model.effective_kv_channels,
    )
    f = model.effective_ffn_hidden_size
    qkv_out = n * d + 2 * g * d
    fc1_out = f * (2 if model.swiglu else 1)
    split = h * qkv_out + n * d * h + h * fc1_out + f * h
    replicated = 2 * norm_parameters(model)
    if not model.disable_bias_linear:
        split += qkv_out + fc1_out
        replicated += 2 * h  # the row-parallel (projection, fc2) biases
    return LayerParameters(split=split, replicated=replicated)


def position_parameters(model: ModelArgs) -> int:
    """The learned absolute position embedding (0 with rope or no positions)."""
    if model.position_embedding_type != "learned_absolute":
        return 0
    return (model.max_position_embeddings or model.seq_length) * model.hidden_size


@dataclass(frozen=True, kw_only=True)
class ParameterCounts:
    """Parameters of the whole model and of the most loaded pipeline stages' ranks."""

    total: int
    """Parameters of the whole model (tied embedding counted once)."""
    per_layer: int
    """One transformer layer, unsplit."""
    embedding: int
    """Word (and learned position) embeddings."""
    output_layer: int
    """Untied output projection (0 when tied)."""
    first_stage_rank: int
    """A rank of the first stage: its layers and the embeddings (with PP = 1, everything)."""
    last_stage_rank: int
    """A rank of the last stage: its layers, the final norm and the output layer (or the tied copy)."""

    @property
    def max_per_rank(self) -> int:
        """Parameters on the most loaded rank (a first or last pipeline stage)."""
        return max(self.first_stage_rank, self.last_stage_rank)


def parameter_counts(model: ModelArgs, *, padded_vocab_size: int, tp: int = 1, pp: int = 1) -> ParameterCounts:
    """Exact parameter counts of Megatron-Core's GPTModel for this shape, split TP × PP."""
    layer = layer_parameters(model)
    norm = norm_parameters(model)
    word = padded_vocab_size * model.hidden_size
    position = position_parameters(model)
    untied = model.untie_embeddings_and_output_weights
    output_layer = word if untied else 0

    layers_per_rank = (model.num_layers // pp) * layer.per_rank(tp)
    first = layers_per_rank + word // tp + position
    if pp == 1:
        first += norm + (word // tp if untied else 0)
        last = first
    else:
        last = layers_per_rank + norm + word // tp
    return ParameterCounts(
        total=layer.total * model.num_layers + word + position + norm + output_layer,
        per_layer=layer.total,
        embedding=word + position,
        output_layer=output_layer,
        first_stage_rank=first,
        last_stage_rank=last,
    )
