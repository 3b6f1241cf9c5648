"""The local spec's norms without apex: --apply-layernorm-1p's zero-centred weights, and the flags that reach
Megatron-Core's TransformerConfig."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from megatron_ext.config.training_config import parse_args
from megatron_ext.training.model import transformer_config_arguments
from megatron_ext.training.norms import TorchNorm, ZeroCenteredLayerNorm, ZeroCenteredRMSNorm

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("kind", "plain", "centred"),
    [("LayerNorm", torch.nn.LayerNorm, ZeroCenteredLayerNorm), ("RMSNorm", torch.nn.RMSNorm, ZeroCenteredRMSNorm)],
)
def test_zero_centred_norms_store_gamma_minus_one(kind: str, plain: type, centred: type) -> None:
    config = SimpleNamespace(layernorm_zero_centered_gamma=True, normalization=kind, sequence_parallel=True)
    norm = TorchNorm(config, 16, eps=1e-5)
    assert type(norm) is centred
    assert torch.equal(norm.weight, torch.zeros(16))  # gamma 1 is stored as 0
    assert all(p.sequence_parallel for p in norm.parameters())  # summed over TP by finalize_model_grads
    reference = plain(16, eps=1e-5)
    x = torch.randn(3, 16)
    assert torch.allclose(norm(x), reference(x))
    gamma = torch.randn(16)
    with torch.no_grad():
        norm.weight.copy_(gamma - 1)
        reference.weight.copy_(gamma)
    assert torch.allclose(norm(x), reference(x), atol=1e-6)
    plain_config = SimpleNamespace(layernorm_zero_centered_gamma=False, normalization=kind, sequence_parallel=False)
    assert type(TorchNorm(plain_config, 16)) is plain


def test_model_flags_reach_megatron_cores_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a GPU with Transformer Engine and apex's softmax kernels, where the fusions are on by default."""
    from megatron_ext.training import model

    monkeypatch.setattr(model, "use_transformer_engine", lambda cfg, device: True)
    monkeypatch.setattr(model, "_has_softmax_kernels", lambda: True)
    fused = ("masked_softmax_fusion", "apply_rope_fusion", "gradient_accumulation_fusion")
    base = ["--mock-data", "--position-embedding-type", "rope"]
    default = transformer_config_arguments(parse_args(base), torch.device("cuda"))
    assert [default[f] for f in fused] == [True, True, True]
    assert not default["layernorm_zero_centered_gamma"]
    switches = ["--no-masked-softmax-fusion", "--no-rope-fusion", "--no-gradient-accumulation-fusion"]
    asked = transformer_config_arguments(parse_args([*base, "--apply-layernorm-1p", *switches]), torch.device("cuda"))
    assert [asked[f] for f in fused] == [False, False, False]
    assert asked["layernorm_zero_centered_gamma"]


def test_model_variants_reach_megatron_cores_config_and_spec() -> None:
    """Megatron-LM's defaults (not TransformerConfig's: its softmax default is fp32) and each variant's field
    (tests/training/test_loss_equivalence.py trains them under several layouts)."""
    from megatron.core.activations import squared_relu

    base = ["--mock-data", "--position-embedding-type", "rope", "--normalization", "RMSNorm"]
    plain = transformer_config_arguments(parse_args(base), torch.device("cpu"))
    assert not plain["attention_softmax_in_fp32"] and not plain["qk_layernorm"]
    assert not plain["apply_query_key_layer_scaling"] and plain["activation_func"] is torch.nn.functional.gelu
    flags = [
        *base,
        "--qk-layernorm",
        "--squared-relu",
        "--attention-softmax-in-fp32",
        "--apply-query-key-layer-scaling",
    ]
    cfg = parse_args(flags)
    asked = transformer_config_arguments(cfg, torch.device("cpu"))
    assert asked["qk_layernorm"] and asked["attention_softmax_in_fp32"] and asked["apply_query_key_layer_scaling"]
    assert asked["activation_func"] is squared_relu
