"""The flags of Megatron-Core's emerging optimizers (Muon, Adaptive Muon, Lion, SOAP): Megatron-LM's names, defaults
and choices (``megatron/training/arguments.py`` at core_v0.19.0), part of the optimizer group (``OptimizerArgs``).

Megatron-Core builds these optimizers itself (``megatron.core.optimizer.get_megatron_optimizer``, from the
``emerging-optimizers`` package); these fields are the ``OptimizerConfig`` fields Megatron-LM sets from its flags.
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_ext.config.flags import opt

OPTIMIZERS = ("adam", "sgd", "muon", "adaptive_muon", "lion", "soap", "dist_muon")
"""``--optimizer``'s choices, Megatron-LM's; ``dist_muon``, its deprecated spelling of ``--optimizer muon
--use-distributed-optimizer``, is refused with that fix (``OptimizerArgs._relations``)."""

EMERGING = ("muon", "adaptive_muon", "lion", "soap")
"""The optimizers Megatron-Core builds from the emerging-optimizers package (its ``_get_megatron_emerging_optimizer``:
every name but adam and sgd)."""

MUON_FAMILY = ("muon", "adaptive_muon")
"""Orthogonalized by Newton-Schulz: the 2-D weights; the rest (embeddings, output layer, norms, biases) take
--muon-scalar-optimizer."""

NS_COEFFICIENTS = ("simple", "quintic", "polar_express", "cans", "aol", "deepseekv4")
"""Newton-Schulz coefficient sets of emerging-optimizers 0.3.0 (its ``NSCoeffT``, without ``custom``, which needs
coefficients no flag gives); ``tests/config/test_emerging_optimizers.py`` checks them against the installed
package."""


@dataclass(frozen=True, kw_only=True)
class EmergingOptimizerArgs:
    """Muon's, Lion's and SOAP's settings (the optimizer group's fields for them)."""

    muon_momentum: float = opt(0.9, "Muon: momentum of its internal SGD.", minimum=0, below=1)
    muon_no_split_qkv: bool = opt(
        False, "Muon: orthogonalize the fused QKV weight whole, not the query, key and value parts apart."
    )
    muon_nesterov: bool = opt(False, "Muon: Nesterov-style momentum in its internal SGD.")
    muon_scale_mode: str = opt(
        "spectral",
        "Muon: the update's scale (spectral keeps Adam's learning rates transferable).",
        choices=["spectral", "unit_rms_norm", "shape_scaling"],
    )
    muon_fp32_matmul_prec: str = opt(
        "medium",
        "Muon: torch's float32 matmul precision in Newton-Schulz (low: torch's setting unchanged, as in Megatron-LM).",
        choices=["low", "medium", "high"],
    )
    muon_coefficient_type: str = opt("quintic", "Muon: the Newton-Schulz coefficients.", choices=list(NS_COEFFICIENTS))
    muon_num_ns_steps: int = opt(5, "Muon: Newton-Schulz iterations per step.", minimum=1)
    muon_tp_mode: str = opt(
        "blockwise",
        "Muon under tensor parallelism: blockwise orthogonalizes each rank's shard (differs from TP 1 by design), "
        "duplicated gathers the whole matrix on every rank, distributed runs Newton-Schulz across the TP ranks.",
        choices=["blockwise", "duplicated", "distributed"],
    )
    muon_extra_scale_factor: float = opt(1.0, "Muon: a further factor on its update.", above=0)
    muon_scalar_optimizer: str = opt(
        "adam",
        "Muon: the optimizer of what it does not orthogonalize (embeddings, output layer, norms, biases).",
        choices=["adam", "lion"],
    )
    lion_beta1: float = opt(
        0.95,
        "Lion as --muon-scalar-optimizer: beta1 (--optimizer lion takes --adam-beta1, as Megatron-Core builds it).",
        minimum=0,
        below=1,
    )
    lion_beta2: float = opt(
        0.98,
        "Lion as --muon-scalar-optimizer: beta2 (--optimizer lion takes --adam-beta2, as Megatron-Core builds it).",
        minimum=0,
        below=1,
    )
    no_use_layer_wise_param_layout: bool = opt(
        False,
        "Emerging optimizers with --use-distributed-optimizer: Megatron-Core's legacy layer-wise path (every "
        "parameter in one buffer, all-gathered after the step) instead of the precomputed shard-aligned layout.",
    )
