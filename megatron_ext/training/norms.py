"""LayerNorm / RMSNorm for the local spec when apex is absent, with sequence parallelism.

Megatron-Core's local spec falls back to ``WrappedTorchNorm`` without apex,
which refuses sequence parallelism. The only thing sequence parallelism asks
of a norm is bookkeeping: its weights are replicated over the TP ranks while
each rank normalises a different slice of the sequence, so the weights'
gradients must be summed over TP. Megatron-Core's ``finalize_model_grads``
does that for every parameter marked ``sequence_parallel`` (as apex's
``FusedLayerNorm`` marks its own); ``TorchNorm`` builds PyTorch's norm and
marks it. ``WrappedTorchNorm`` also refuses ``--apply-layernorm-1p``; the
zero-centred norms below give it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


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
        centred = config.layernorm_zero_centered_gamma or zero_centered_gamma
        kind = normalization or config.normalization
        if kind == "LayerNorm":
            norm: torch.nn.Module = (ZeroCenteredLayerNorm if centred else torch.nn.LayerNorm)(hidden_size, eps=eps)
        elif kind == "RMSNorm":
            norm = (ZeroCenteredRMSNorm if centred else torch.nn.RMSNorm)(hidden_size, eps=eps)
        else:
            raise ValueError(f"normalization {kind!r}: only LayerNorm and RMSNorm are supported without apex/TE")
        if config.sequence_parallel:
            for param in norm.parameters():
                param.sequence_parallel = True  # type: ignore[attr-defined]
        return norm


class _ZeroCenteredGamma:
    """The stored weight is gamma − 1 (``--apply-layernorm-1p``, as apex's and Transformer Engine's
    ``zero_centered_gamma``): it starts at 0 and the scale applied is ``weight + 1``."""

    weight: Any  # the norm's own (a Parameter, or None without an affine weight)

    def reset_parameters(self) -> None:
        super().reset_parameters()  # type: ignore[misc]
        if self.weight is not None:
            torch.nn.init.zeros_(self.weight)

    @property
    def gamma(self) -> torch.Tensor | None:
        return self.weight + 1 if self.weight is not None else None


class ZeroCenteredLayerNorm(_ZeroCenteredGamma, torch.nn.LayerNorm):
    """LayerNorm with a zero-centred weight."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.normalized_shape, self.gamma, self.bias, self.eps)


class ZeroCenteredRMSNorm(_ZeroCenteredGamma, torch.nn.RMSNorm):
    """RMSNorm with a zero-centred weight (``--apply-layernorm-1p`` with ``--normalization RMSNorm``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.normalized_shape, self.gamma, self.eps)
