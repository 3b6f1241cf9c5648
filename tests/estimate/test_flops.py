"""Megatron-LM's FLOPs formula on hand-computed cases."""

from __future__ import annotations

import pytest

from megatron_ext.config.arguments import ModelArgs
from megatron_ext.estimate.flops import flops_per_step
from megatron_ext.estimate.hardware import peak_flops_for

pytestmark = pytest.mark.unit


def test_matches_paper_closed_form() -> None:
    # Narayanan et al. 2021 without recomputation: 72·B·s·l·h²·(1 + s/6h + V/12lh).
    B, s, L, h, V = 512, 2048, 24, 2048, 51200
    expected = 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))
    model = ModelArgs(num_layers=L, hidden_size=h, ffn_hidden_size=4 * h, num_attention_heads=16, seq_length=s)
    assert (model.effective_num_query_groups, model.effective_kv_channels) == (16, h // 16)
    got = flops_per_step(model, batch_size=B, padded_vocab_size=V)
    assert got == pytest.approx(expected, rel=1e-12)


def test_gqa_and_swiglu_by_hand() -> None:
    # h=8, n=4, g=2, d=2, f=16, swiglu, s=4, l=1, V=16, B=1:
    # 12·1·4·1·64 · [(1 + 2/4 + 4/8)·1 + (16/8)·1.5 + 16/(2·1·8)] = 3072 · (2 + 3 + 1)
    model = ModelArgs(
        num_layers=1,
        hidden_size=8,
        ffn_hidden_size=16,
        num_attention_heads=4,
        group_query_attention=True,
        num_query_groups=2,
        kv_channels=2,
        seq_length=4,
        swiglu=True,
    )
    got = flops_per_step(model, batch_size=1, padded_vocab_size=16)
    assert got == 3072 * 6


def test_peak_lookup() -> None:
    assert peak_flops_for("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops_for("NVIDIA H100 PCIe") == 756e12
    assert peak_flops_for("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_flops_for("Some Other GPU") is None
