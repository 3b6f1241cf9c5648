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


def flops_per_step(
    *,
    batch_size: int,
    seq_length: int,
    num_layers: int,
    hidden_size: int,
    ffn_hidden_size: int,
    num_attention_heads: int,
    num_query_groups: int,
    kv_channels: int,
    padded_vocab_size: int,
    swiglu: bool,
) -> float:
    """Model FLOPs of one training step (forward + backward) over ``batch_size`` sequences."""
    h = hidden_size
    query_ratio = kv_channels * num_attention_heads / h
    attention = (1 + num_query_groups / num_attention_heads + seq_length / h) * query_ratio
    mlp = (ffn_hidden_size / h) * (1.5 if swiglu else 1.0)
    logits = padded_vocab_size / (2 * num_layers * h)
    return 12.0 * batch_size * seq_length * num_layers * h * h * (attention + mlp + logits)


# Dense bf16/fp16 tensor-core peak of common GPUs, FLOP/s (vendor data sheets).
# Checked in order, so the more specific names come first.
PEAK_FLOPS = {
    "H100 PCIE": 756e12,
    "H100 NVL": 835e12,
    "A100": 312e12,
    "H100": 989e12,
    "H200": 989e12,
    "H800": 989e12,
    "B200": 2250e12,
    "L40S": 362e12,
}


def peak_flops_for(device_name: str) -> float | None:
    """Peak dense bf16 FLOP/s for a CUDA device name, or None when unknown."""
    upper = device_name.upper()
    for key, value in PEAK_FLOPS.items():
        if key in upper:
            return value
    return None
