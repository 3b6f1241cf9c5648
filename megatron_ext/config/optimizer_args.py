"""``OptimizerArgs``: the optimizer, its learning-rate and weight-decay schedules, the training precision (bf16,
fp16 and its loss scaling, FP8, the precision-aware optimizer) and activation recomputation; the other groups are in
``arguments.py``, ``data_args.py`` and ``run_args.py``."""

from __future__ import annotations

from dataclasses import dataclass

from megatron_ext.config.arguments import ConfigError, _Options
from megatron_ext.config.emerging_optimizer_args import EMERGING, OPTIMIZERS, EmergingOptimizerArgs
from megatron_ext.config.flags import opt

FP8_RECIPES = ("delayed", "tensorwise", "mxfp8", "blockwise")
"""``--fp8-recipe``'s choices: Transformer Engine's scaling recipes as Megatron-LM offers them."""

PRECISION_AWARE_DTYPES: dict[str, tuple[str, ...]] = {
    "main_grads_dtype": ("fp32", "bf16"),
    "main_params_dtype": ("fp32", "fp16"),
    "exp_avg_dtype": ("fp32", "fp16", "bf16", "fp8"),
    "exp_avg_sq_dtype": ("fp32", "fp16", "bf16", "fp8"),
}
"""The precision-aware optimizer's dtype flags (``OptimizerConfig``'s fields of the same names) and the values
Megatron-LM's parser offers for each (fp8: ``torch.uint8``, as Megatron-LM maps it)."""


@dataclass(frozen=True, kw_only=True)
class OptimizerArgs(EmergingOptimizerArgs, _Options):
    optimizer: str = opt(
        "adam",
        "Optimizer: Megatron-Core's Adam(W) or SGD, or its emerging optimizers Muon, Adaptive Muon, Lion and SOAP "
        "(the emerging-optimizers package).",
        choices=list(OPTIMIZERS),
    )
    lr: float = opt(1e-4, "Peak learning rate.", above=0)
    min_lr: float = opt(0.0, "Learning rate at the end of decay.", minimum=0)
    lr_warmup_iters: int = opt(0, "Iterations of linear warm-up.", minimum=0)
    lr_warmup_samples: int = opt(0, "Samples of linear warm-up (with --train-samples).", minimum=0)
    lr_warmup_fraction: float | None = opt(
        None, "Warm-up as a fraction of the decay length (instead of --lr-warmup-iters/-samples).", minimum=0
    )
    lr_warmup_init: float = opt(0.0, "Learning rate at the start of the warm-up.", minimum=0)
    lr_decay_iters: int | None = opt(None, "Iterations of decay (default --train-iters).", minimum=0)
    lr_decay_samples: int | None = opt(
        None, "Samples of decay, with --train-samples (default --train-samples).", minimum=0
    )
    lr_decay_style: str = opt(
        "linear",
        "Decay shape. WSD: warm-up, stable at --lr, then an anneal to --min-lr over the decay's last "
        "--lr-wsd-decay-iters/-samples.",
        choices=["constant", "linear", "cosine", "inverse-square-root", "WSD"],
    )
    lr_wsd_decay_style: str = opt(
        "exponential",
        "Shape of the WSD anneal.",
        choices=["exponential", "linear", "cosine", "minus_sqrt"],
    )
    lr_wsd_decay_iters: int | None = opt(None, "Iterations of the WSD anneal.", minimum=0)
    lr_wsd_decay_samples: int | None = opt(None, "Samples of the WSD anneal (with --train-samples).", minimum=0)
    decoupled_lr: float | None = opt(
        None, "Peak learning rate of the input embedding and output layer (default --lr).", above=0
    )
    decoupled_min_lr: float | None = opt(
        None, "Final learning rate of the input embedding and output layer (default --min-lr).", minimum=0
    )
    weight_decay: float = opt(0.01, "Weight decay (with --weight-decay-incr-style constant).", minimum=0)
    apply_wd_to_qk_layernorm: bool = opt(
        False, "Apply weight decay to --qk-layernorm's weights too (the other norms and biases still have none)."
    )
    start_weight_decay: float | None = opt(None, "Weight decay at the start (a non-constant style).", minimum=0)
    end_weight_decay: float | None = opt(None, "Weight decay at the end of training (a non-constant style).", minimum=0)
    weight_decay_incr_style: str = opt(
        "constant",
        "How weight decay goes from --start-weight-decay to --end-weight-decay over training.",
        choices=["constant", "linear", "cosine"],
    )
    adam_beta1: float = opt(0.9, "Adam beta1.", minimum=0, maximum=1)
    adam_beta2: float = opt(0.999, "Adam beta2.", minimum=0, maximum=1)
    adam_eps: float = opt(1e-8, "Adam epsilon.", above=0)
    sgd_momentum: float = opt(0.9, "SGD momentum.", minimum=0, maximum=1)
    clip_grad: float = opt(1.0, "Clip the global gradient norm to this (0 disables).", minimum=0)
    bf16: bool = opt(False, "bf16 mixed precision (fp32 master weights).", estimate=True)
    fp16: bool = opt(False, "fp16 mixed precision with dynamic loss scaling.", estimate=True)
    loss_scale: float | None = opt(None, "Static loss scale for fp16 (default dynamic).", above=0)
    initial_loss_scale: float = opt(2.0**32, "Initial dynamic loss scale for fp16.", above=0)
    min_loss_scale: float = opt(1.0, "Lowest dynamic loss scale for fp16.", above=0)
    loss_scale_window: float = opt(1000, "Steps without overflow before the dynamic loss scale grows.", above=0)
    hysteresis: int = opt(2, "Overflows tolerated before the dynamic loss scale shrinks.", minimum=1)
    grad_reduce_in_bf16: bool = opt(
        False, "With --bf16: reduce gradients in bf16 instead of fp32 (half the traffic, less precise).", estimate=True
    )
    seed: int = opt(1234, "Random seed.", minimum=0)
    recompute_granularity: str | None = opt(
        None, "Activation recomputation.", choices=["full", "selective"], estimate=True
    )
    recompute_method: str | None = opt(
        None, "With full recomputation: which layers.", choices=["uniform", "block"], estimate=True
    )
    recompute_num_layers: int | None = opt(None, "With full recomputation: layers per group.", estimate=True, minimum=1)
    fp8_format: str | None = opt(
        None,
        "FP8 GEMMs with Transformer Engine: e4m3 everywhere, or hybrid (e4m3 forward, e5m2 gradients); needs TE's "
        "layers on a GPU that has FP8.",
        choices=["e4m3", "hybrid"], estimate=True,
    )  # fmt: skip
    fp8_recipe: str = opt(
        "delayed",
        "With --fp8-format: Transformer Engine's scaling recipe (mxfp8 needs Blackwell).",
        choices=list(FP8_RECIPES), estimate=True,
    )  # fmt: skip
    fp8_margin: int = opt(0, "With --fp8-format: the scaling factor's margin (powers of 2).", minimum=0)
    fp8_interval: int = opt(1, "With --fp8-format: steps between scaling-factor updates (deprecated in TE).", minimum=1)
    fp8_amax_history_len: int = opt(1, "With --fp8-format delayed scaling: the amax history's length.", minimum=1)
    fp8_amax_compute_algo: str = opt(
        "most_recent",
        "With --fp8-format delayed scaling: the amax of the history used.",
        choices=["most_recent", "max"],
    )
    no_fp8_wgrad: bool = opt(
        False,
        "With --fp8-format: compute weight gradients in the training precision, not FP8.",
        aliases=("--disable-fp8-wgrad",),
    )
    fp8_param_gather: bool = opt(
        False, "With --fp8-format: keep the compute weights in FP8 and all-gather them in FP8 (distributed optimizer)."
    )
    fp16_lm_cross_entropy: bool = opt(
        False,
        "With --fp16: Megatron-LM's switch for the loss in fp16, passed to Megatron-Core's GPTModel as Megatron-LM "
        "passes it. Megatron-Core 0.19's vocabulary-parallel cross entropy casts the logits to fp32 either way, so "
        "the loss is the same as without it.",
    )
    use_precision_aware_optimizer: bool = opt(
        False,
        "Transformer Engine's FusedAdam keeps the main weights, main gradients and Adam's moments in the dtypes "
        "below (Megatron-Core's precision-aware optimizer); needs Transformer Engine on GPUs, --optimizer adam and "
        "--use-distributed-optimizer.",
    )
    main_grads_dtype: str = opt(
        "fp32",
        "With --use-precision-aware-optimizer: the main gradients' dtype (bf16: with --bf16, gradients are also "
        "accumulated and reduced in bf16, as Megatron-LM does).",
        choices=PRECISION_AWARE_DTYPES["main_grads_dtype"],
    )
    main_params_dtype: str = opt(
        "fp32",
        "With --use-precision-aware-optimizer: the main weights' dtype.",
        choices=PRECISION_AWARE_DTYPES["main_params_dtype"],
    )
    exp_avg_dtype: str = opt(
        "fp32",
        "With --use-precision-aware-optimizer: the dtype Adam's first moment is stored in (the kernel computes in "
        "fp32).",
        choices=PRECISION_AWARE_DTYPES["exp_avg_dtype"],
    )
    exp_avg_sq_dtype: str = opt(
        "fp32",
        "With --use-precision-aware-optimizer: the dtype Adam's second moment is stored in (the kernel computes in "
        "fp32).",
        choices=PRECISION_AWARE_DTYPES["exp_avg_sq_dtype"],
    )
    log_num_zeros_in_grad: bool = opt(
        False, "Count the zero gradients at every step (Megatron-Core's optimizer): the log line and 'num-zeros'."
    )
    calculate_per_token_loss: bool = opt(
        False, "Average the loss over all tokens of the step instead of per microbatch."
    )

    @property
    def precision_aware_dtypes(self) -> dict[str, str]:
        """The precision-aware optimizer's dtype flags given other than fp32 (field name → value)."""
        return {name: getattr(self, name) for name in PRECISION_AWARE_DTYPES if getattr(self, name) != "fp32"}

    def _relations(self) -> None:
        if self.bf16 and self.fp16:
            raise ConfigError("--bf16 and --fp16 are mutually exclusive; choose one")
        if self.optimizer == "dist_muon":
            raise ConfigError(
                "--optimizer dist_muon is Megatron-LM's deprecated spelling of Muon with its layer-wise distributed "
                "optimizer; give --optimizer muon --use-distributed-optimizer"
            )
        if self.optimizer == "adaptive_muon":
            raise ConfigError(
                "--optimizer adaptive_muon fails at its first step in Megatron-Core 0.19.2 with emerging-optimizers "
                "0.3.0 (its TensorParallelAdaptiveMuon never sets the scale_mode that AdaptiveMuon.step reads); use "
                "--optimizer muon"
            )
        if self.fp16 and self.optimizer in EMERGING:
            # Megatron-Core's _get_megatron_emerging_optimizer raises on fp16 (no loss-scaled emerging optimizer).
            raise ConfigError(f"--optimizer {self.optimizer} does not train with --fp16 in Megatron-Core; use --bf16")
        if self.fp16_lm_cross_entropy and not self.fp16:
            raise ConfigError("--fp16-lm-cross-entropy applies with --fp16 only (as Megatron-LM requires); give --fp16")
        lower = [f"--{name.replace('_', '-')} {value}" for name, value in self.precision_aware_dtypes.items()]
        if lower and not self.use_precision_aware_optimizer:
            raise ConfigError(
                f"{' and '.join(lower)} need --use-precision-aware-optimizer (without it Megatron-Core keeps the "
                "optimizer's tensors in fp32); give it, or drop them"
            )
        if self.use_precision_aware_optimizer and self.optimizer != "adam":
            raise ConfigError(
                f"--use-precision-aware-optimizer is Transformer Engine's FusedAdam: give --optimizer adam, not "
                f"{self.optimizer}"
            )
        fp8_only = [flag for flag, on in (("--fp8-param-gather", self.fp8_param_gather), ("--no-fp8-wgrad",
                    self.no_fp8_wgrad)) if on]  # fmt: skip
        if fp8_only and self.fp8_format is None:
            raise ConfigError(f"{' and '.join(fp8_only)} apply with --fp8-format only; give it (e4m3 or hybrid)")
        if self.fp8_param_gather and self.fp8_recipe not in ("delayed", "tensorwise", "mxfp8", "blockwise"):
            raise ConfigError("--fp8-param-gather needs a Transformer Engine recipe")
        if self.grad_reduce_in_bf16 and not self.bf16:
            raise ConfigError("--grad-reduce-in-bf16 applies only with --bf16 (Megatron-LM ignores it otherwise)")
        if self.lr_warmup_fraction is not None and (self.lr_warmup_iters or self.lr_warmup_samples):
            raise ConfigError("give one of --lr-warmup-fraction and --lr-warmup-iters/--lr-warmup-samples")
        wsd_length = self.lr_wsd_decay_iters is not None or self.lr_wsd_decay_samples is not None
        if self.lr_decay_style == "WSD" and not wsd_length:
            raise ConfigError("--lr-decay-style WSD needs the anneal's length: --lr-wsd-decay-iters (or -samples)")
        if self.lr_decay_style != "WSD" and (wsd_length or self.lr_wsd_decay_style != "exponential"):
            raise ConfigError("--lr-wsd-decay-iters/-samples/-style apply only with --lr-decay-style WSD")
        if self.decoupled_min_lr is not None and self.decoupled_lr is None:
            raise ConfigError("--decoupled-min-lr applies only with --decoupled-lr")
        if self.decoupled_lr is not None and (self.decoupled_min_lr or self.min_lr) > self.decoupled_lr:
            raise ConfigError(
                f"the embedding and output layer's final learning rate "
                f"({self.decoupled_min_lr if self.decoupled_min_lr is not None else self.min_lr:g}: "
                f"--decoupled-min-lr, default --min-lr) is larger than --decoupled-lr {self.decoupled_lr:g}"
            )
        if self.lr_warmup_fraction is not None and self.lr_warmup_fraction >= 1:
            raise ConfigError(
                f"--lr-warmup-fraction {self.lr_warmup_fraction:g} must be below 1: the warm-up must end before "
                "the decay does"
            )
        varying = self.start_weight_decay is not None or self.end_weight_decay is not None
        if self.weight_decay_incr_style == "constant" and varying:
            raise ConfigError(
                "--start-weight-decay/--end-weight-decay need --weight-decay-incr-style linear or cosine "
                "(constant uses --weight-decay)"
            )
        if self.weight_decay_incr_style != "constant" and (
            self.start_weight_decay is None or self.end_weight_decay is None
        ):
            raise ConfigError(
                f"--weight-decay-incr-style {self.weight_decay_incr_style} needs both --start-weight-decay and "
                "--end-weight-decay"
            )
        if self.recompute_granularity == "full" and self.recompute_method is None:
            raise ConfigError("--recompute-granularity full needs --recompute-method uniform|block")
        if self.recompute_method is not None and self.recompute_granularity != "full":
            raise ConfigError("--recompute-method is only used with --recompute-granularity full")
        if self.min_lr > self.lr:
            raise ConfigError(
                f"--min-lr {self.min_lr:g} is larger than --lr {self.lr:g}; lower --min-lr to --lr or less"
            )
