"""Megatron-Core's optimizer and ``OptimizerParamScheduler`` for a run: their configs' arguments.

As Megatron-LM's ``get_optimizer_param_scheduler`` computes them: the
scheduler counts samples, so iteration counts are multiplied by the global
batch (``config.iterations.lr_steps`` has the formulas), and a checkpoint's
schedule state means the same in both kinds of run. The per-group peak and
final rates of ``--decoupled-lr`` are the optimizer's parameter groups'
(Megatron-Core's ``get_megatron_optimizer``).
"""

from __future__ import annotations

from typing import Any

from megatron_ext.config.emerging_optimizer_args import EMERGING
from megatron_ext.config.iterations import lr_steps
from megatron_ext.config.optimizer_args import PRECISION_AWARE_DTYPES
from megatron_ext.config.training_config import TrainingConfig


def scheduler_arguments(cfg: TrainingConfig) -> dict[str, Any]:
    """Keyword arguments of ``OptimizerParamScheduler`` (all but the optimizer)."""
    o = cfg.optim
    steps = lr_steps(o, cfg.run, cfg.layout.global_batch_size)
    constant = o.weight_decay_incr_style == "constant"
    return {
        "init_lr": o.lr_warmup_init,
        "max_lr": o.lr,
        "min_lr": o.min_lr,
        "lr_warmup_steps": steps.warmup,
        "lr_decay_steps": steps.decay,
        "lr_decay_style": o.lr_decay_style,
        "start_wd": o.weight_decay if constant else o.start_weight_decay,
        "end_wd": o.weight_decay if constant else o.end_weight_decay,
        # A constant weight decay only needs a valid length; the decay's keeps --train-iters free to grow on a
        # resume (a changed length would differ from the checkpoint's).
        "wd_incr_steps": steps.decay if constant else steps.wd_incr,
        "wd_incr_style": o.weight_decay_incr_style,
        "wsd_decay_steps": steps.wsd_decay,
        "lr_wsd_decay_style": o.lr_wsd_decay_style,
        # Megatron-LM's semantics: a schedule that differs from the checkpoint's is an error unless one of
        # the two flags says which wins.
        "use_checkpoint_opt_param_scheduler": cfg.run.use_checkpoint_opt_param_scheduler,
        "override_opt_param_scheduler": cfg.run.override_opt_param_scheduler,
    }


def param_group_overrides(config: Any) -> Any:
    """Megatron-Core's standard parameter-group overrides (no weight decay on biases and norms; --decoupled-lr on
    the embedding and output layer), with the decoupled group marked ``is_decoupled_lr``.

    Megatron-Core 0.16.1 matches a checkpoint's groups to the optimizer's by (wd_mult, lr_mult,
    is_expert_parallel, is_decoupled_lr), but its overrides leave is_decoupled_lr False, so the decoupled group
    and the default one look alike and a resumed run fails on their sizes.
    """
    from megatron.core.optimizer import get_standard_config_overrides

    overrides = get_standard_config_overrides(config)
    for override in overrides.values():
        if "max_lr" in override:
            override["is_decoupled_lr"] = True
    return overrides


def optimizer_config_of(cfg: TrainingConfig, *, params_dtype: Any, timers: Any) -> Any:
    """Megatron-Core's ``OptimizerConfig`` for this run (its fields from Megatron-LM's flags)."""
    from megatron.core.optimizer import OptimizerConfig

    o = cfg.optim
    emerging = o.optimizer in EMERGING
    return OptimizerConfig(
        optimizer=o.optimizer,
        lr=o.lr,
        min_lr=o.min_lr,
        decoupled_lr=o.decoupled_lr,
        decoupled_min_lr=o.decoupled_min_lr,
        weight_decay=o.weight_decay,
        apply_wd_to_qk_layernorm=o.apply_wd_to_qk_layernorm,
        adam_beta1=o.adam_beta1,
        adam_beta2=o.adam_beta2,
        adam_eps=o.adam_eps,
        sgd_momentum=o.sgd_momentum,
        muon_momentum=o.muon_momentum,
        muon_split_qkv=not o.muon_no_split_qkv,
        muon_nesterov=o.muon_nesterov,
        muon_scale_mode=o.muon_scale_mode,
        muon_fp32_matmul_prec=o.muon_fp32_matmul_prec,
        muon_coefficient_type=o.muon_coefficient_type,
        muon_num_ns_steps=o.muon_num_ns_steps,
        muon_tp_mode=o.muon_tp_mode,
        muon_extra_scale_factor=o.muon_extra_scale_factor,
        muon_scalar_optimizer=o.muon_scalar_optimizer,
        lion_beta1=o.lion_beta1,
        lion_beta2=o.lion_beta2,
        clip_grad=o.clip_grad,
        bf16=o.bf16,
        fp16=o.fp16,
        params_dtype=params_dtype,
        loss_scale=o.loss_scale,
        initial_loss_scale=o.initial_loss_scale,
        min_loss_scale=o.min_loss_scale,
        loss_scale_window=o.loss_scale_window,
        hysteresis=o.hysteresis,
        # Megatron-LM (validate_args): an emerging optimizer with --use-distributed-optimizer runs Megatron-Core's
        # layer-wise distributed optimizer instead, whose non-Muon groups it builds as distributed ones itself.
        use_distributed_optimizer=cfg.layout.use_distributed_optimizer and not emerging,
        use_layer_wise_distributed_optimizer=cfg.layout.use_distributed_optimizer and emerging,
        overlap_param_gather_with_optimizer_step=False,
        log_num_zeros_in_grad=o.log_num_zeros_in_grad,
        timers=timers,
        use_precision_aware_optimizer=o.use_precision_aware_optimizer,
        **{name: precision_aware_dtype(getattr(o, name)) for name in PRECISION_AWARE_DTYPES},
    )


def precision_aware_dtype(name: str) -> Any:
    """The torch dtype of a precision-aware optimizer's dtype flag, as Megatron-LM maps it (fp8: uint8, the
    storage Transformer Engine's FusedAdam scales its moments into)."""
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.uint8}[name]
