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
against the built model by ``tests/estimate/test_derived_numbers.py``) and what the
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
    linear_weights: int
    """The four linears' weight matrices (QKV, projection, fc1, fc2), part of ``split``: the weights Transformer
    Engine keeps in FP8 with ``--fp8-param-gather``."""

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
    weights = h * qkv_out + n * d * h + h * fc1_out + f * h
    split = weights
    replicated = 2 * norm_parameters(model)
    if model.qk_layernorm:  # one norm over the head dimension for the queries, one for the keys
        replicated += 2 * (d if model.normalization == "RMSNorm" else 2 * d)
    if not model.disable_bias_linear:
        split += qkv_out + fc1_out
        replicated += 2 * h  # the row-parallel (projection, fc2) biases
    elif model.add_qkv_bias:
        split += qkv_out
    return LayerParameters(split=split, replicated=replicated, linear_weights=weights)


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
    stage_ranks: tuple[int, ...]
    """A rank of every pipeline stage: its layers, plus the embeddings on the first stage and the
    final norm and output layer (or the tied copy) on the last (with PP = 1, everything)."""
    stage_linear_weights: tuple[int, ...]
    """Of ``stage_ranks``, the transformer layers' linear weights (``LayerParameters.linear_weights`` / TP)."""

    @property
    def first_stage_rank(self) -> int:
        return self.stage_ranks[0]

    @property
    def last_stage_rank(self) -> int:
        return self.stage_ranks[-1]

    @property
    def max_per_rank(self) -> int:
        """Parameters on the most loaded rank (any stage: with uneven stages a middle one may be)."""
        return max(self.stage_ranks)

    @property
    def linear_weight_share(self) -> float:
        """Of the most loaded rank's parameters, the share that is the layers' linear weights."""
        rank = max(range(len(self.stage_ranks)), key=lambda r: self.stage_ranks[r])
        return self.stage_linear_weights[rank] / self.stage_ranks[rank]


def parameter_counts(
    model: ModelArgs,
    *,
    padded_vocab_size: int,
    tp: int = 1,
    pp: int = 1,
    stage_layers: tuple[int, ...] | None = None,
) -> ParameterCounts:
    """Exact parameter counts of Megatron-Core's GPTModel for this shape, split TP × PP.

    ``stage_layers``: transformer layers on each pipeline rank (``ParallelLayout.rank_layers``);
    by default an even split.
    """
    layer = layer_parameters(model)
    norm = norm_parameters(model)
    word = padded_vocab_size * model.hidden_size
    position = position_parameters(model)
    untied = model.untie_embeddings_and_output_weights
    output_layer = word if untied else 0

    layers = stage_layers or (model.num_layers // pp,) * pp
    ranks = [count * layer.per_rank(tp) for count in layers]
    ranks[0] += word // tp + position
    # The last stage holds the final norm and the output layer; tied, a copy of the embedding (PP > 1).
    ranks[-1] += norm + (word // tp if untied or len(ranks) > 1 else 0)
    return ParameterCounts(
        total=layer.total * model.num_layers + word + position + norm + output_layer,
        per_layer=layer.total,
        embedding=word + position,
        output_layer=output_layer,
        stage_ranks=tuple(ranks),
        stage_linear_weights=tuple(count * (layer.linear_weights // tp) for count in layers),
    )
