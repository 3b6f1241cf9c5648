"""The arguments of Megatron-Core's ``OptimizerParamScheduler`` for a run.

As Megatron-LM's ``get_optimizer_param_scheduler`` computes them for
iteration-based training: steps count samples (iterations × global batch), so
that a checkpoint's schedule state means the same in both. The warm-up is
``--lr-warmup-iters`` iterations, or ``--lr-warmup-fraction`` of the decay
length; the weight decay goes from ``--start-weight-decay`` to
``--end-weight-decay`` over ``--train-iters`` (or stays ``--weight-decay``).
"""

from __future__ import annotations

from typing import Any

from megatron_ext.config.arguments import TrainingConfig


def scheduler_arguments(cfg: TrainingConfig) -> dict[str, Any]:
    """Keyword arguments of ``OptimizerParamScheduler`` (all but the optimizer)."""
    o, gbs = cfg.optim, cfg.layout.global_batch_size
    decay_steps = o.decay_iters * gbs
    warmup_steps = o.lr_warmup_fraction * decay_steps if o.lr_warmup_fraction is not None else o.lr_warmup_iters * gbs
    constant = o.weight_decay_incr_style == "constant"
    return {
        "init_lr": o.lr_warmup_init,
        "max_lr": o.lr,
        "min_lr": o.min_lr,
        "lr_warmup_steps": warmup_steps,
        "lr_decay_steps": decay_steps,
        "lr_decay_style": o.lr_decay_style,
        "start_wd": o.weight_decay if constant else o.start_weight_decay,
        "end_wd": o.weight_decay if constant else o.end_weight_decay,
        # Megatron-LM: over --train-iters. A constant decay only needs a valid length; the decay length keeps
        # --train-iters free to grow on a resume (a changed length would differ from the checkpoint's).
        "wd_incr_steps": decay_steps if constant else cfg.run.train_iters * gbs,
        "wd_incr_style": o.weight_decay_incr_style,
        # Megatron-LM's semantics: a schedule that differs from the checkpoint's is an error unless one of
        # the two flags says which wins.
        "use_checkpoint_opt_param_scheduler": cfg.run.use_checkpoint_opt_param_scheduler,
        "override_opt_param_scheduler": cfg.run.override_opt_param_scheduler,
    }
