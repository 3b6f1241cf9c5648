"""SDPAttention against Megatron-Core's own DotProductAttention, in one CPU process.

Same inputs, same outputs and gradients (fp32): causal and explicit masks,
multi-head and grouped-query attention, the head split of tensor parallelism
(the per-rank head counts), and dropout drawn from the tensor-parallel RNG
stream. Whole-model loss equivalence (SDPA is the default of the local spec)
is in test_loss_equivalence.py.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.distributed  # a one-process gloo group for Megatron-Core's parallel state


def _config(*, heads: int, groups: int, dropout: float = 0.0):  # -> TransformerConfig
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(
        num_layers=1,
        hidden_size=16 * heads,
        num_attention_heads=heads,
        num_query_groups=groups,
        attention_dropout=dropout,
        masked_softmax_fusion=False,
        use_cpu_initialization=True,
    )


def _pair(config):  # -> (Megatron-Core's, ours)
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    from megatron_ext.training.attention import SDPAttention

    kwargs = dict(config=config, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self")
    return DotProductAttention(**kwargs), SDPAttention(**kwargs)


def _qkv(seq: int, batch: int, heads: int, groups: int, dim: int = 16) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seq * 7 + heads)
    shapes = [(seq, batch, heads, dim), (seq, batch, groups, dim), (seq, batch, groups, dim)]
    return [torch.randn(s, generator=g, dtype=torch.float32).requires_grad_() for s in shapes]


def _run(module: torch.nn.Module, qkv: list[torch.Tensor], mask: torch.Tensor | None) -> list[torch.Tensor]:
    inputs = [t.detach().clone().requires_grad_() for t in qkv]
    out = module(*inputs, mask)
    # A fixed, non-uniform weighting so every output element reaches the gradients.
    weights = torch.linspace(-1.0, 1.0, out.numel()).view_as(out)
    (out * weights).sum().backward()
    return [out.detach(), *(t.grad for t in inputs)]


@pytest.mark.parametrize(
    ("heads", "groups"),
    [(4, 4), (8, 2), (2, 1)],
    ids=["multi-head", "gqa-8-over-2", "tp-rank-of-gqa"],  # the last: 2 heads / 1 group as one TP rank holds them
)
@pytest.mark.parametrize("masking", ["causal", "explicit-mask"])
@pytest.mark.parametrize("gqa", ["native", "repeated"])
def test_same_output_and_gradients_as_megatron_core(
    parallel_state: None, heads: int, groups: int, masking: str, gqa: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from megatron_ext.training.attention import SDPAttention

    # Both ways of handing key/value groups to SDPA (the GPU flash path passes them as they are).
    monkeypatch.setattr(SDPAttention, "native_gqa", lambda self, q, mask: gqa == "native")
    seq, batch = 24, 3
    ref, ours = _pair(_config(heads=heads, groups=groups))
    qkv = _qkv(seq, batch, heads, groups)
    mask = None
    if masking == "explicit-mask":
        # Megatron's convention: True = do not attend. Causal plus a few blocked keys.
        mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1).expand(batch, 1, seq, seq).clone()
        mask[:, :, 5:, 2] = True
    expected, got = _run(ref, qkv, mask), _run(ours, qkv, mask)
    assert got[0].shape == (seq, batch, heads * 16)
    for name, e, g in zip(["output", "dq", "dk", "dv"], expected, got, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")


def test_dropout_draws_from_the_tensor_parallel_stream(parallel_state: None) -> None:
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    _, ours = _pair(_config(heads=4, groups=4, dropout=0.5))
    qkv = _qkv(16, 2, 4, 4)
    tracker = get_cuda_rng_tracker()
    ours.train()
    default_before = torch.get_rng_state()
    tracker_before = {k: v.clone() for k, v in tracker.get_states().items()}
    dropped = ours(*qkv, None)
    # The default stream is untouched; the model-parallel stream advanced.
    assert torch.equal(torch.get_rng_state(), default_before)
    assert any(not torch.equal(v, tracker_before[k]) for k, v in tracker.get_states().items())
    ours.eval()
    clean = ours(*qkv, None)
    assert not torch.allclose(dropped, clean)
    # Inverted dropout keeps the expectation: the averages agree loosely.
    assert dropped.mean().item() == pytest.approx(clean.mean().item(), abs=0.15)


def test_unsupported_features_are_refused(parallel_state: None) -> None:
    from megatron.core.transformer import TransformerConfig

    from megatron_ext.training.attention import SDPAttention

    config = TransformerConfig(num_layers=1, hidden_size=32, num_attention_heads=2, window_size=(8, 0))
    with pytest.raises(ValueError, match="sliding-window"):
        SDPAttention(config=config, layer_number=1, attn_mask_type=None, attention_type="self")


def test_kernel_choice_maps_megatron_backend_names() -> None:
    from torch.nn.attention import SDPBackend

    from megatron_ext.training.attention import sdpa_kernels

    assert sdpa_kernels("auto") is None
    assert sdpa_kernels("flash") == [SDPBackend.FLASH_ATTENTION]
    assert sdpa_kernels("fused") == [SDPBackend.EFFICIENT_ATTENTION]
    assert sdpa_kernels("unfused") == [SDPBackend.MATH]


def test_groups_are_passed_natively_only_where_flash_can_run(parallel_state: None) -> None:
    _, ours = _pair(_config(heads=8, groups=2))
    query = torch.zeros(4, 1, 8, 16)
    assert not ours.native_gqa(query, None)  # fp32 on CPU: repeat the groups
    assert not ours.native_gqa(query.bfloat16(), None)  # no GPU
