"""Model FLOPs per step and utilisation, with Megatron-LM's formula.

For a GPT with ``l`` layers, hidden size ``h``, sequence ``s``, padded
vocabulary ``V`` and ``B`` sequences per step, Megatron-LM counts (Narayanan
et al. 2021, appendix; generalised in Megatron-LM's ``training.py`` to GQA,
SwiGLU and any MLP width)::

    F = 12 · B · s · l · h² · [ (1 + g/n + s/h) · (n·d / h)      # attention
                                + (f / h) · (3/2 if SwiGLU else 1)  # MLP
                                + V / (2 · l · h) ]                 # logits

with ``n`` heads, ``g`` query groups, ``d`` channels per head and ``f`` the
MLP width. The factor 12 is 3 (forward + two backward GEMMs) × 2 (multiply
and add) × 2 (two GEMMs per block). For ``f = 4h``, ``g = n`` and
``n·d = h`` this is the paper's ``72 B s l h² (1 + s/6h + V/12lh)``. Model
FLOPs do not count activation recomputation (the paper's "hardware FLOPs"
would). The attention term counts the whole ``s × s`` score matrix, as the
paper and Megatron-LM's ``training.py`` of that formula do, although a causal
mask needs only half of it; a causal-aware count gives about 7% fewer FLOPs
(and MFU) for a 1.3B GPT at sequence 2048. The layout calculator is
calibrated against the paper's figures, which use this convention.
"""

from __future__ import annotations

from megatron_ext.config.arguments import ModelArgs


def layer_forward_flops(model: ModelArgs, *, sequences: int) -> float:
    """Forward FLOPs of one transformer layer over ``sequences`` sequences: ``4·b·s·h²·(attention + MLP)``."""
    h, s, n = model.hidden_size, model.seq_length, model.num_attention_heads
    query_ratio = model.effective_kv_channels * n / h
    attention = (1 + model.effective_num_query_groups / n + s / h) * query_ratio
    mlp = (model.effective_ffn_hidden_size / h) * (1.5 if model.swiglu else 1.0)
    return 4.0 * sequences * s * h * h * (attention + mlp)


def logits_forward_flops(model: ModelArgs, *, sequences: int, padded_vocab_size: int) -> float:
    """Forward FLOPs of the output layer over ``sequences`` sequences: ``2·b·s·h·V``."""
    return 2.0 * sequences * model.seq_length * model.hidden_size * padded_vocab_size


def attention_core_forward_flops(model: ModelArgs, *, sequences: int) -> float:
    """Forward FLOPs of one layer's attention core (scores and context), what selective recomputation repeats.

    ``4·b·s²·n·d``: the ``s/h`` term of the attention factor.
    """
    s = model.seq_length
    return 4.0 * sequences * s * s * model.num_attention_heads * model.effective_kv_channels


def flops_per_step(model: ModelArgs, *, batch_size: int, padded_vocab_size: int) -> float:
    """Model FLOPs of one training step (forward + backward = 3 × forward) over ``batch_size`` sequences."""
    layers = model.num_layers * layer_forward_flops(model, sequences=batch_size)
    logits = logits_forward_flops(model, sequences=batch_size, padded_vocab_size=padded_vocab_size)
    return 3.0 * (layers + logits)
