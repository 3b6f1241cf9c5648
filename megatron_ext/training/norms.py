"""LayerNorm / RMSNorm for the local spec when apex is absent, with sequence parallelism.

Megatron-Core's local spec falls back to ``WrappedTorchNorm`` without apex,
which refuses sequence parallelism. The only thing sequence parallelism asks
of a norm is bookkeeping: its weights are replicated over the TP ranks while
each rank normalises a different slice of the sequence, so the weights'
gradients must be summed over TP. Megatron-Core's ``finalize_model_grads``
does that for every parameter marked ``sequence_parallel`` (as apex's
``FusedLayerNorm`` marks its own); ``TorchNorm`` builds PyTorch's norm and
marks it.
"""

from __future__ import annotations

from typing import Any

import torch


class TorchNorm:
    """``torch.nn.LayerNorm`` or ``torch.nn.RMSNorm`` (by ``config.normalization``), TP/SP aware.

    Same constructor as Megatron-Core's norm classes, so it fits a
    ``ModuleSpec``; returns the PyTorch module itself.
    """

    def __new__(  # type: ignore[misc]
        cls,
        config: Any,
        hidden_size: int,
        eps: float = 1e-5,
        persist_layer_norm: bool = False,
        zero_centered_gamma: bool = False,
        normalization: str | None = None,
    ) -> torch.nn.Module:
        if config.layernorm_zero_centered_gamma or zero_centered_gamma:
            raise ValueError("zero-centred gamma needs apex or Transformer Engine norms")
        kind = normalization or config.normalization
        if kind == "LayerNorm":
            norm: torch.nn.Module = torch.nn.LayerNorm(hidden_size, eps=eps)
        elif kind == "RMSNorm":
            norm = torch.nn.RMSNorm(hidden_size, eps=eps)
        else:
            raise ValueError(f"normalization {kind!r}: only LayerNorm and RMSNorm are supported without apex/TE")
        if config.sequence_parallel:
            for param in norm.parameters():
                param.sequence_parallel = True  # type: ignore[attr-defined]
        return norm
