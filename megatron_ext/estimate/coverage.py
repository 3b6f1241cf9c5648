"""Which of ``pretrain_gpt.py``'s flags the memory and step-time estimates take into account, and how.

Every flag of the groups that shape a training step (model, parallelism, batch, optimizer) is one of:

- **modelled**: the flag table marks it ``estimate=True`` (the layout calculator takes it, and the estimate
  follows it; ``PARTLY_MODELLED`` notes what it leaves out, printed as the approximations are);
- **approximated** (``APPROXIMATED``): it changes memory or time in a way the estimate does not follow exactly;
  the note says how, and the dry run prints it whenever the flag is given;
- **no effect** (``NO_EFFECT``): it changes neither the memory nor the time of a step, and says why.

``tests/estimate/test_coverage.py`` fails when a flag is in none of these, so a new flag is classified when it
is added.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from megatron_ext.config.arguments import BatchArgs, ModelArgs, ParallelArgs
from megatron_ext.config.flags import flag_of
from megatron_ext.config.optimizer_args import OptimizerArgs

STEP_GROUPS: tuple[type, ...] = (ModelArgs, ParallelArgs, BatchArgs, OptimizerArgs)
"""The argument groups whose flags can change a step's memory or time."""

_KERNEL = "a kernel fusion: the element-wise passes' time is not counted pass by pass"
_FP8 = "memory: FP8 weight copies, transposes and scaling state are not counted, and activations are counted in the training precision"

APPROXIMATED: dict[str, str] = {
    "squared_relu": "memory and time as GeLU's (the MLP keeps its input either way)",
    "openai_gelu": "memory and time as the exact GeLU's (an element-wise function of the same tensor; unfused, its "
    "intermediates are not counted)",
    "qk_layernorm": "its parameters are counted, not the normalized queries and keys kept for the backward pass",
    "cross_entropy_loss_fusion": "memory: the output logits are counted as the unfused loss keeps them (the fused "
    "one keeps less); its time is counted, kernel by kernel",
    "no_bias_gelu_fusion": _KERNEL,
    "no_bias_swiglu_fusion": _KERNEL,
    "no_bias_dropout_fusion": _KERNEL,
    "no_masked_softmax_fusion": _KERNEL,
    "no_rope_fusion": _KERNEL,
    "no_gradient_accumulation_fusion": "the bf16 weight gradient it materialises before adding it to the fp32 "
    "buffer is transient and not counted",
    "optimizer": "optimizer memory is Adam's (two fp32 moments); SGD keeps one or none, Muon and Lion one on most "
    "weights, less than estimated; SOAP also keeps preconditioners, more; Muon's Newton-Schulz is not timed",
    "muon_num_ns_steps": "Muon's Newton-Schulz iterations (a few matrix products per weight and step) are not timed",
    "muon_tp_mode": "Muon's gathers of tensor-parallel weights and its Newton-Schulz iterations are not timed",
    "no_use_layer_wise_param_layout": "the layer-wise distributed optimizer's memory and all-gathers are counted as "
    "the distributed optimizer's",
    "fp8_param_gather": "the all-gather moves the layers' weights in FP8; memory counts them in the training "
    "precision, as without the flag",
    **dict.fromkeys(
        ("use_precision_aware_optimizer", "main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"),
        "the main weights, main gradients and Adam's moments are counted in fp32; lower dtypes keep less, and bf16 "
        "main gradients also halve the data-parallel reduction",
    ),
    **dict.fromkeys(
        (
            "tp_comm_overlap_rs_dgrad",
            "tp_comm_overlap_cfg",
            *(
                f"no_tp_comm_{n}"
                for n in ("overlap_ag", "overlap_rs", "split_ag", "split_rs", "bulk_dgrad", "bulk_wgrad")
            ),
        ),
        "a detail of --tp-comm-overlap, which is modelled as its default (each collective hidden behind its GEMM "
        "but one chunk of the ring)",
    ),
    "rampup_batch_size": "the step is the full batch's; the ramp-up's first steps are shorter",
    **dict.fromkeys(
        ("no_align_grad_reduce", "no_align_param_gather"),
        "the data-parallel reduction (and all-gather) is hidden behind the last backward (first forward) pass as "
        "a whole, whatever its buckets and whenever each stage starts them",
    ),
    "defer_embedding_wgrad_compute": "priced as without it: the last stage keeps each deferred microbatch's "
    "output-layer input and logits' gradient until the step's end (2·s·b·(h + V)/TP bytes in bf16 with SP), not "
    "counted, and runs their weight-gradient GEMMs in the pipeline's drain, not priced (docs/layout-model.md, "
    "Deferred output-layer weight gradients); printed for layouts with a pipeline only, as Megatron-Core requires",
    "wgrad_deferral_limit": "a detail of --defer-embedding-wgrad-compute (see there)",
    "overlap_p2p_communication_warmup_flush": "the warm-up and flush transfers are counted as exposed",
    "use_tp_pp_dp_mapping": "the groups are placed on nodes in Megatron-Core's default order (TP, CP, DP, PP)",
}
"""Flags whose effect on memory or time the estimate does not follow exactly: what it does instead."""

PARTLY_MODELLED: dict[str, str] = {
    "fp8_format": _FP8,
}
"""Modelled flags (``estimate=True``) whose effect is followed in part: what the estimate leaves out."""

_SCHEDULE = "a value of the learning-rate or weight-decay schedule"
_LOSS_SCALE = "fp16's loss scaling: one multiply and a check per step"
_FP8_DETAIL = "a detail of --fp8-format's recipe (see there)"

NO_EFFECT: dict[str, str] = {
    **dict.fromkeys(
        (
            "muon_momentum",
            "muon_no_split_qkv",
            "muon_nesterov",
            "muon_scale_mode",
            "muon_fp32_matmul_prec",
            "muon_coefficient_type",
            "muon_extra_scale_factor",
            "muon_scalar_optimizer",
            "lion_beta1",
            "lion_beta2",
        ),
        "a coefficient or choice inside the optimizer's update (--optimizer is what is approximated)",
    ),
    **dict.fromkeys(
        ("rotary_base", "use_rope_scaling", "rope_scaling_factor", "rotary_seq_len_interpolation_factor"),
        "the rotary frequencies",
    ),
    "rotary_percent": "the rotary embedding's element-wise cost is not counted at any share of the head",
    "attention_softmax_in_fp32": "the fp32 scores are transient; the kept probabilities are in the training precision",
    "apply_query_key_layer_scaling": "a scale inside the softmax",
    "norm_epsilon": "a constant of the normalization",
    "cross_entropy_fusion_impl": "native is the loss --cross-entropy-loss-fusion runs; te is refused with it and "
    "unused without it",
    "apply_layernorm_1p": "the same parameters and cost as LayerNorm",
    "window_size": "taken only where the window covers the sequence: full causal attention",
    "init_method_std": "the initial weights' scale",
    "no_clone_scatter_output_in_embedding": "whether the embedding's scattered output is copied (a transient tensor)",
    **dict.fromkeys(
        (
            "lr",
            "min_lr",
            "lr_warmup_iters",
            "lr_warmup_samples",
            "lr_warmup_fraction",
            "lr_warmup_init",
            "lr_decay_iters",
            "lr_decay_samples",
            "lr_decay_style",
            "lr_wsd_decay_style",
            "lr_wsd_decay_iters",
            "lr_wsd_decay_samples",
            "decoupled_lr",
            "decoupled_min_lr",
            "weight_decay",
            "start_weight_decay",
            "end_weight_decay",
            "weight_decay_incr_style",
            "apply_wd_to_qk_layernorm",
        ),
        _SCHEDULE,
    ),
    **dict.fromkeys(("adam_beta1", "adam_beta2", "adam_eps", "sgd_momentum"), "a constant of the optimizer's update"),
    "clip_grad": "one norm of the gradients per step (one small all-reduce)",
    **dict.fromkeys(
        ("loss_scale", "initial_loss_scale", "min_loss_scale", "loss_scale_window", "hysteresis"), _LOSS_SCALE
    ),
    "seed": "the random numbers",
    "fp16_lm_cross_entropy": "Megatron-Core 0.19 computes the cross entropy in fp32 with or without it",
    **dict.fromkeys(
        ("fp8_margin", "fp8_interval", "fp8_amax_history_len", "fp8_amax_compute_algo", "no_fp8_wgrad"),
        _FP8_DETAIL,
    ),
    "log_num_zeros_in_grad": "a count over the gradients when the step is logged",
    "calculate_per_token_loss": "how the loss is averaged",
    "tp_comm_bootstrap_backend": "how --tp-comm-overlap's buffers are set up, once",
    **dict.fromkeys(
        ("ddp_average_in_collective", "ddp_pad_buckets_for_high_nccl_busbw", "no_gradient_reduce_div_fusion"),
        "where the gradients are scaled and how buckets are padded: the same bytes reduced",
    ),
    "world_size": "the GPU count: the calculator's --gpus",
    "pipeline_model_parallel_comm_backend": "the pipeline's transfers are counted at the network's bandwidth",
    "decrease_batch_size_if_needed": "which global batch an elastic job keeps: the layout, estimated as given",
}
"""Flags of the step groups that change neither memory nor time, with why."""


def classification(group: type, name: str) -> str:
    """``modelled``, ``approximated`` or ``no effect`` for field ``name`` of ``group``; KeyError if none."""
    field = next(f for f in dataclasses.fields(group) if f.name == name)
    if field.metadata.get("estimate"):
        return "modelled"
    if name in APPROXIMATED:
        return "approximated"
    if name in NO_EFFECT:
        return "no effect"
    raise KeyError(f"{flag_of(field)} ({group.__name__}) is not classified in megatron_ext/estimate/coverage.py")


def approximations(groups: dict[str, Any]) -> list[str]:
    """One line for every approximated flag that ``groups`` (argument group instances) give a non-default value."""
    lines = []
    for values in groups.values():
        for field in dataclasses.fields(values):
            note = APPROXIMATED.get(field.name) or PARTLY_MODELLED.get(field.name)
            if note and getattr(values, field.name) not in (field.default, None, False):
                lines.append(f"{flag_of(field)}: {note}")
    return lines
