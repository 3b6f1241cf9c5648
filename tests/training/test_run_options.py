"""Megatron-LM's schedule, loss-scaler, gradient-reduction and memory flags, as Megatron-LM computes them."""

from __future__ import annotations

import pytest
import torch

from megatron_ext.config.arguments import ConfigError
from megatron_ext.config.training_config import parse_args
from megatron_ext.training.housekeeping import Housekeeping
from megatron_ext.training.optimizer_scheduler import scheduler_arguments

pytestmark = pytest.mark.unit

BASE = ["--mock-data", "--global-batch-size", "8", "--train-iters", "100"]


def test_scheduler_steps_count_samples_as_megatron_lm() -> None:
    plain = scheduler_arguments(parse_args([*BASE, "--lr-warmup-iters", "10", "--lr-decay-iters", "80"]))
    assert (plain["lr_warmup_steps"], plain["lr_decay_steps"]) == (10 * 8, 80 * 8)
    assert plain["start_wd"] == plain["end_wd"] == 0.01 and plain["wd_incr_style"] == "constant"
    assert plain["init_lr"] == 0.0
    # Megatron-LM: warm-up = fraction × decay steps (not rounded), from --lr-warmup-init.
    frac = scheduler_arguments(parse_args([*BASE, "--lr-warmup-fraction", "0.013", "--lr-warmup-init", "1e-6"]))
    assert frac["lr_warmup_steps"] == pytest.approx(0.013 * 100 * 8) and frac["init_lr"] == 1e-6
    # A changing weight decay runs over --train-iters.
    wd = ["--weight-decay-incr-style", "cosine", "--start-weight-decay", "0.0", "--end-weight-decay", "0.1"]
    varying = scheduler_arguments(parse_args([*BASE, "--lr-decay-iters", "50", *wd]))
    assert (varying["start_wd"], varying["end_wd"], varying["wd_incr_steps"]) == (0.0, 0.1, 100 * 8)


def test_megatron_cores_scheduler_takes_them_and_warms_up_from_the_init_lr() -> None:
    import torch
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    args = scheduler_arguments(
        parse_args([*BASE, "--lr", "1e-3", "--lr-warmup-fraction", "0.1", "--lr-warmup-init", "1e-4"])
    )
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = OptimizerParamScheduler(optimizer, **args)  # type: ignore[arg-type]
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-4)
    scheduler.step(increment=8 * 5)  # half-way through the 10-iteration warm-up
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-4 + 0.5 * (1e-3 - 1e-4))


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--lr-warmup-fraction", "0.1", "--lr-warmup-iters", "5"],
            "one of --lr-warmup-fraction and --lr-warmup-iters",
        ),
        (["--lr-warmup-fraction", "1"], "must be below 1"),
        (["--start-weight-decay", "0.1"], "need --weight-decay-incr-style linear or cosine"),
        (["--weight-decay-incr-style", "linear", "--end-weight-decay", "0.1"], "needs both"),
        (["--grad-reduce-in-bf16"], "only with --bf16"),
        (["--manual-gc-interval", "10"], "only with --manual-gc"),
    ],
)
def test_contradictions_are_named(flags: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_args([*BASE, *flags])


def test_gradients_reduce_in_fp32_unless_grad_reduce_in_bf16() -> None:
    from megatron_ext.training.model import ddp_config

    assert ddp_config(parse_args([*BASE, "--bf16"])).grad_reduce_in_fp32
    assert not ddp_config(parse_args([*BASE, "--bf16", "--grad-reduce-in-bf16"])).grad_reduce_in_fp32
    assert ddp_config(parse_args([*BASE, "--fp16"])).grad_reduce_in_fp32
    assert not ddp_config(parse_args(BASE)).grad_reduce_in_fp32  # fp32 gradients already


def test_loss_scaler_flags_reach_the_optimizer_config() -> None:
    config = parse_args([*BASE, "--fp16", "--min-loss-scale", "4", "--loss-scale-window", "50", "--hysteresis", "3"])
    assert (config.optim.min_loss_scale, config.optim.loss_scale_window, config.optim.hysteresis) == (4, 50, 3)


def _calls(flags: list[str], *, on_gpu: bool, iterations: int = 6, evaluate: bool = True) -> list[str]:
    calls: list[str] = []
    keeping = Housekeeping(
        parse_args([*BASE, *flags]).run,
        on_gpu=on_gpu,
        collect=lambda generation=2: calls.append(f"collect{generation}"),
        disable=lambda: calls.append("disable"),
        empty_cache=lambda: calls.append("empty"),
    )
    keeping.start()
    for iteration in range(1, iterations + 1):
        keeping.after_forward_backward()
        keeping.after_optimizer_step()
        keeping.after_iteration(iteration)
    if evaluate:
        keeping.before_evaluation()
        keeping.after_evaluation()
    return calls


def test_manual_gc_and_emptying_the_cache_happen_where_megatron_lm_does_them() -> None:
    assert _calls([], on_gpu=True) == []  # Python's collector as usual, the cache kept
    assert _calls(["--manual-gc", "--manual-gc-interval", "3"], on_gpu=False) == [
        "disable", "collect2", "collect2", "collect2", "collect2", "collect0",
    ]  # fmt: skip
    assert _calls(["--manual-gc", "--no-manual-gc-eval"], on_gpu=False) == ["disable", "collect2"]
    assert _calls(["--empty-unused-memory-level", "2"], on_gpu=True, iterations=2) == ["empty"] * 4
    assert _calls(["--empty-unused-memory-level", "1"], on_gpu=True, iterations=2) == ["empty"] * 2
    assert _calls(["--empty-unused-memory-level", "2"], on_gpu=False) == []  # no GPU cache on CPU


def test_optimizer_flags_reach_megatron_cores_optimizer_config_and_weight_decay_groups() -> None:
    from megatron_ext.training.optimizer_scheduler import optimizer_config_of, param_group_overrides

    flags = [*BASE, "--qk-layernorm", "--no-weight-decay-cond-type", "apply_wd_to_qk_layernorm", "--clip-grad", "0.5"]
    cfg = parse_args(flags)
    assert (
        cfg.optim.apply_wd_to_qk_layernorm
        and "WARNING: --no-weight-decay-cond-type is deprecated" in cfg.adjustments[0]
    )
    config = optimizer_config_of(cfg, params_dtype=torch.float32, timers=None)
    assert config.apply_wd_to_qk_layernorm and config.clip_grad == 0.5
    q_norm = torch.nn.Parameter(torch.ones(8))

    def no_decay(optimizer_config: object, name: str) -> bool:
        return any(
            key.matches(q_norm, name) and override.get("wd_mult") == 0.0
            for key, override in param_group_overrides(optimizer_config).items()
        )

    # Megatron-Core's rule: the query/key norms decay with the flag; biases and the other norms never do.
    assert not no_decay(config, "decoder.layers.0.self_attention.q_layernorm.weight")
    assert no_decay(config, "decoder.layers.0.input_layernorm.weight")
    default = optimizer_config_of(parse_args([*BASE, "--qk-layernorm"]), params_dtype=torch.float32, timers=None)
    assert no_decay(default, "decoder.layers.0.self_attention.q_layernorm.weight")


PP4_VP2 = ["--num-layers", "8", "--pipeline-model-parallel-size", "4", "--num-virtual-stages-per-pipeline-rank", "2"]
PP2_VP2 = ["--num-layers", "8", "--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank", "2"]


def test_megatron_lms_ddp_flags_reach_the_ddp_config_as_it_passes_them() -> None:
    from megatron_ext.training.model import ddp_config

    plain = ddp_config(parse_args(BASE), num_parameters=1000)
    assert (plain.bucket_size, plain.average_in_collective, plain.pad_buckets_for_high_nccl_busbw) == (
        None,
        False,
        False,
    )
    assert plain.gradient_reduce_div_fusion and not plain.align_param_gather
    # Megatron-LM's get_model: --ddp-num-buckets N is the rank's parameters // N per bucket.
    assert ddp_config(parse_args([*BASE, "--ddp-num-buckets", "3"]), num_parameters=1000).bucket_size == 333
    flags = ["--ddp-bucket-size", "4096", "--ddp-average-in-collective", "--ddp-pad-buckets-for-high-nccl-busbw",
             "--no-gradient-reduce-div-fusion", "--device", "cuda"]  # fmt: skip
    tuned = ddp_config(parse_args([*BASE, *flags]), num_parameters=1000)
    assert (tuned.bucket_size, tuned.average_in_collective, tuned.pad_buckets_for_high_nccl_busbw) == (4096, True, True)
    assert not tuned.gradient_reduce_div_fusion
    # Megatron-LM aligns the interleaved schedule's parameter all-gathers unless --no-align-param-gather; never
    # without interleaving.
    overlap = ["--use-distributed-optimizer", "--overlap-param-gather", "--world-size", "4"]
    assert ddp_config(parse_args([*BASE, *PP4_VP2, *overlap])).align_param_gather
    assert not ddp_config(parse_args([*BASE, *PP4_VP2, *overlap, "--no-align-param-gather"])).align_param_gather
    assert not ddp_config(parse_args([*BASE, *PP4_VP2[:4], *overlap])).align_param_gather


def test_pipeline_p2p_switches_reach_the_schedule_as_megatron_lm_sets_them() -> None:
    from megatron_ext.training.model import transformer_config_arguments

    def p2p(flags: list[str]) -> tuple[bool, bool, bool]:
        kw = transformer_config_arguments(parse_args([*BASE, "--world-size", "4", *flags]), torch.device("cpu"))
        return kw["overlap_p2p_comm"], kw["batch_p2p_comm"], kw["overlap_p2p_comm_warmup_flush"]

    assert p2p(PP4_VP2) == (True, False, False)
    assert p2p([*PP4_VP2, "--overlap-p2p-communication-warmup-flush"]) == (True, False, True)
    assert p2p([*PP4_VP2, "--no-overlap-p2p-communication"]) == (False, True, False)
    assert p2p(PP4_VP2[:4]) == (False, True, False)  # 1F1B: batched and blocking


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--ddp-bucket-size", "10", "--ddp-num-buckets", "2"], "give --ddp-bucket-size or --ddp-num-buckets"),
        (["--ddp-num-buckets", "0"], "--ddp-num-buckets must be at least 1"),
        ([*PP4_VP2[:4], "--overlap-p2p-communication-warmup-flush"], "applies to the interleaved schedule only"),
        ([*PP2_VP2, "--no-overlap-p2p-communication"], "needs PP > 2 \\(PP is 2\\)"),
        (["--dataloader-fast-cache-load"], "give --data-cache-path"),
        (["--pipeline-model-parallel-comm-backend", "ucc", "--device", "cpu"], "pipeline groups are gloo's"),
        (["--ddp-average-in-collective", "--device", "cpu"], "which gloo \\(the CPU backend\\) does not have"),
    ],
)
def test_ddp_and_p2p_flags_megatron_lm_refuses_are_refused_with_the_reason(flags: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_args([*BASE, "--world-size", "4", *flags])


def test_dataset_builder_and_embedding_flags_reach_megatron_core_as_megatron_lm_passes_them() -> None:
    from megatron_ext.data.tokenizers import build_tokenizer
    from megatron_ext.training.datasets import dataset_config
    from megatron_ext.training.model import transformer_config_arguments

    tokenizer = build_tokenizer("NullTokenizer", vocab_size=1023)
    plain = dataset_config(parse_args(BASE), tokenizer)
    assert (plain.num_dataset_builder_threads, plain.mid_level_dataset_surplus) == (1, 0.005)
    assert not (plain.allow_ambiguous_pad_tokens or plain.fast_cache_load or plain.defer_npy_index_mmap)
    flags = ["--num-dataset-builder-threads", "4", "--mid-level-dataset-surplus", "0.01",
             "--allow-ambiguous-pad-tokens", "--dataloader-fast-cache-load", "--dataloader-defer-npy-index-mmap",
             "--data-cache-path", "cache"]  # fmt: skip
    tuned = dataset_config(parse_args([*BASE, *flags]), tokenizer)
    assert (tuned.num_dataset_builder_threads, tuned.mid_level_dataset_surplus) == (4, 0.01)
    assert tuned.allow_ambiguous_pad_tokens and tuned.fast_cache_load and tuned.defer_npy_index_mmap
    for flag in ("--no-clone-scatter-output-in-embedding", "--disable-clone-scatter-output-in-embedding"):
        kw = transformer_config_arguments(parse_args([*BASE, flag]), torch.device("cpu"))
        assert kw["clone_scatter_output_in_embedding"] is False
    assert transformer_config_arguments(parse_args(BASE), torch.device("cpu"))["clone_scatter_output_in_embedding"]
