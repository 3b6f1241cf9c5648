"""Derived numbers of a run, computed without building anything.

Used by ``--dry-run`` and printed at the start of every run.
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_ext.config.arguments import TrainingConfig


@dataclass(frozen=True)
class ParameterCounts:
    total: int
    """Parameters of the whole model (tied embedding counted once)."""
    per_layer: int
    embedding: int
    """Word (and learned position) embeddings."""
    output_layer: int
    """Untied output projection (0 when tied)."""
    max_per_rank: int
    """Parameters on the most loaded rank (a first or last pipeline stage)."""


def parameter_counts(cfg: TrainingConfig) -> ParameterCounts:
    """Exact parameter counts of Megatron-Core's GPTModel for this shape.

    Per layer: QKV ``h·(n·d + 2·g·d)``, output projection ``n·d·h``, MLP
    ``h·f·(2 if SwiGLU else 1) + f·h``, biases when enabled, two norms.
    TP splits the matrices, their biases (except the row-parallel ones) and
    the vocabulary; norms and row-parallel biases are replicated.
    """
    m = cfg.model
    layout = cfg.layout
    tp = layout.tp
    h, n, g, d = m.hidden_size, m.num_attention_heads, m.effective_num_query_groups, m.effective_kv_channels
    f = m.effective_ffn_hidden_size
    bias = not m.disable_bias_linear
    norm = 2 * h if m.normalization == "LayerNorm" else h
    qkv_out = n * d + 2 * g * d
    fc1_out = f * (2 if m.swiglu else 1)

    split = h * qkv_out + n * d * h + h * fc1_out + f * h
    replicated = 2 * norm
    if bias:
        split += qkv_out + fc1_out
        replicated += 2 * h  # the row-parallel (projection, fc2) biases
    per_layer = split + replicated
    per_layer_rank = split // tp + replicated

    vocab = cfg.padded_vocab_size
    word = vocab * h
    position = m.max_position_embeddings or m.seq_length
    position_params = position * h if m.position_embedding_type == "learned_absolute" else 0
    output_layer = word if m.untie_embeddings_and_output_weights else 0
    total = per_layer * m.num_layers + word + position_params + norm + output_layer

    layers_per_rank = layout.layers_per_pipeline_stage
    first = layers_per_rank * per_layer_rank + word // tp + position_params
    # The last stage holds the final norm and the output layer: its own when
    # untied, a copy of the word embedding when tied and PP > 1.
    last_extra = norm + (word // tp if (m.untie_embeddings_and_output_weights or layout.pp > 1) else 0)
    if layout.pp == 1:
        max_rank = first + norm + (word // tp if m.untie_embeddings_and_output_weights else 0)
    else:
        max_rank = max(first, layers_per_rank * per_layer_rank + last_extra)
    return ParameterCounts(
        total=total,
        per_layer=per_layer,
        embedding=word + position_params,
        output_layer=output_layer,
        max_per_rank=max_rank,
    )


def describe(cfg: TrainingConfig) -> list[str]:
    """The plan: layout, batch, tokens per step, parameters."""
    counts = parameter_counts(cfg)
    layout = cfg.layout
    tokens = layout.global_batch_size * cfg.model.seq_length
    lines = list(layout.describe())
    lines += [
        f"tokens per step: {tokens:,} ({layout.global_batch_size} sequences × {cfg.model.seq_length})",
        f"padded vocabulary: {cfg.padded_vocab_size:,}",
        f"parameters: {counts.total:,} in total, {counts.max_per_rank:,} on the most loaded rank",
        f"training: {cfg.run.train_iters} iterations = {cfg.run.train_iters * tokens:,} tokens",
    ]
    return lines
