"""Megatron-LM's loss and precision switches: ``--fp16-lm-cross-entropy`` reaches Megatron-Core's GPTModel, the
precision-aware optimizer's flags reach its OptimizerConfig and DDP as Megatron-LM passes them (Transformer Engine
mocked as present) and are refused, naming it, without Transformer Engine; ``--no-one-logger`` is accepted with a
note; ``--no-check-for-nan-in-loss-and-grad`` is parsed (its run: ``tests/training/test_resilience.py``)."""

from __future__ import annotations

import importlib.machinery
import inspect
import sys
import types
from typing import Any

import pytest
import torch

from megatron_ext.config.arguments import ConfigError
from megatron_ext.config.training_config import parse_args

pytestmark = pytest.mark.unit

PRECISION_AWARE = """--mock-data --bf16 --use-distributed-optimizer --use-precision-aware-optimizer
    --main-grads-dtype bf16 --main-params-dtype fp16 --exp-avg-dtype fp8 --exp-avg-sq-dtype bf16
    --world-size 8""".split()


def test_fp16_lm_cross_entropy_needs_fp16_and_reaches_gpt_model(monkeypatch: pytest.MonkeyPatch) -> None:
    from megatron.core.models import gpt

    from megatron_ext.training import model

    with pytest.raises(ConfigError, match="--fp16-lm-cross-entropy applies with --fp16 only"):
        parse_args(["--mock-data", "--bf16", "--fp16-lm-cross-entropy"])
    built: dict[str, Any] = {}
    monkeypatch.setattr(gpt, "GPTModel", lambda **kwargs: built.update(kwargs))
    monkeypatch.setattr(model, "layer_spec", lambda *args, **kwargs: None)
    for argv, expected in ((["--fp16", "--fp16-lm-cross-entropy"], True), (["--fp16"], False)):
        cfg = parse_args(["--mock-data", *argv])
        model.gpt_model(cfg, pre_process=True, post_process=True, vp_stage=None, device=torch.device("cpu"))
        assert built["fp16_lm_cross_entropy"] is expected


def test_megatron_core_computes_the_cross_entropy_in_fp32_whatever_the_switch() -> None:
    """What the docs say the switch changes (nothing, on this Megatron-Core): the loss never reads it, and the
    vocabulary-parallel cross entropy casts the logits to fp32. A Megatron-Core that reads it fails here."""
    from megatron.core.models.common.language_module.language_module import LanguageModule
    from megatron.core.tensor_parallel.cross_entropy import VocabParallelCrossEntropy

    assert "fp16_lm_cross_entropy" not in inspect.getsource(LanguageModule.compute_language_model_loss)
    logits, _ = VocabParallelCrossEntropy.calculate_logits_max(torch.zeros(2, 3, dtype=torch.float16))
    assert logits.dtype == torch.float32


def test_precision_aware_dtypes_follow_megatron_lms_rules() -> None:
    o = parse_args(PRECISION_AWARE).optim
    assert o.use_precision_aware_optimizer
    assert o.precision_aware_dtypes == {
        "main_grads_dtype": "bf16", "main_params_dtype": "fp16", "exp_avg_dtype": "fp8", "exp_avg_sq_dtype": "bf16"
    }  # fmt: skip
    with pytest.raises(ConfigError, match="--exp-avg-dtype fp8 need --use-precision-aware-optimizer"):
        parse_args(["--mock-data", "--exp-avg-dtype", "fp8"])
    with pytest.raises(ConfigError, match="--use-precision-aware-optimizer needs --use-distributed-optimizer"):
        parse_args([f for f in PRECISION_AWARE if f != "--use-distributed-optimizer"])
    with pytest.raises(ConfigError, match="is Transformer Engine's FusedAdam: give --optimizer adam, not sgd"):
        parse_args([*PRECISION_AWARE, "--optimizer", "sgd"])
    with pytest.raises(SystemExit):  # argparse's choices: Megatron-LM offers fp32 and bf16 for the main gradients
        parse_args([*PRECISION_AWARE, "--main-grads-dtype", "fp16"])


def test_precision_aware_optimizer_is_refused_without_transformer_engine_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from megatron_ext.training import model

    with pytest.raises(ConfigError) as refused:
        parse_args([*PRECISION_AWARE, "--device", "cpu"])
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("--use-precision-aware-optimizer needs Transformer Engine's FusedAdam (CUDA), and this")
    cfg = parse_args(PRECISION_AWARE)  # a dry run for a GPU cluster: accepted
    with pytest.raises(ConfigError, match=r"FusedAdam \(CUDA\), and this run is on CPU"):
        model.check_transformer_engine(cfg, torch.device("cpu"))
    monkeypatch.setattr(model.importlib.util, "find_spec", lambda name, package=None: None)
    with pytest.raises(ConfigError, match=r"FusedAdam \(CUDA\), and Transformer Engine is not installed; run on GPUs"):
        model.check_transformer_engine(cfg, torch.device("cuda"))


class _FusedAdam:
    """The signature Megatron-Core checks for in Transformer Engine's FusedAdam (``OptimizerConfig``)."""

    def __init__(
        self,
        params: Any,
        *,
        master_weights: bool = False,
        master_weight_dtype: torch.dtype = torch.float32,
        exp_avg_dtype: torch.dtype = torch.float32,
        exp_avg_sq_dtype: torch.dtype = torch.float32,
        use_decoupled_grad: bool = False,
    ) -> None:
        del params, master_weights, master_weight_dtype, exp_avg_dtype, exp_avg_sq_dtype, use_decoupled_grad


def _transformer_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Transformer Engine 2.8 with its FusedAdam, as far as Megatron-Core's OptimizerConfig looks."""
    import megatron.core.utils
    from packaging.version import Version

    modules = {}
    for name in ("transformer_engine", "transformer_engine.pytorch", "transformer_engine.pytorch.optimizers"):
        modules[name] = types.ModuleType(name)
        modules[name].__spec__ = importlib.machinery.ModuleSpec(name, None)
        monkeypatch.setitem(sys.modules, name, modules[name])
    modules["transformer_engine.pytorch.optimizers"].FusedAdam = _FusedAdam  # type: ignore[attr-defined]
    monkeypatch.setattr(megatron.core.utils, "_te_version", Version("2.8.0"))


def test_precision_aware_flags_reach_optimizer_config_and_ddp(monkeypatch: pytest.MonkeyPatch) -> None:
    from megatron_ext.training import model
    from megatron_ext.training.optimizer_scheduler import optimizer_config_of

    _transformer_engine(monkeypatch)
    cfg = parse_args(PRECISION_AWARE)
    model.check_transformer_engine(cfg, torch.device("cuda"))  # installed: nothing to refuse
    config = optimizer_config_of(cfg, params_dtype=torch.bfloat16, timers=None)
    assert config.use_precision_aware_optimizer and config.use_distributed_optimizer
    dtypes = (config.main_grads_dtype, config.main_params_dtype, config.exp_avg_dtype, config.exp_avg_sq_dtype)
    assert dtypes == (torch.bfloat16, torch.float16, torch.uint8, torch.bfloat16)  # fp8: uint8, as Megatron-LM
    # bf16 main gradients: the DDP accumulates and reduces them in bf16, as Megatron-LM's validate_args sets it.
    assert not model.ddp_config(cfg).grad_reduce_in_fp32
    plain = optimizer_config_of(parse_args(["--mock-data", "--bf16"]), params_dtype=torch.bfloat16, timers=None)
    assert not plain.use_precision_aware_optimizer and plain.exp_avg_dtype == torch.float32
    assert model.ddp_config(parse_args(["--mock-data", "--bf16"])).grad_reduce_in_fp32


def test_no_one_logger_is_accepted_with_a_note() -> None:
    cfg = parse_args(["--mock-data", "--no-one-logger"])
    assert any("one-logger telemetry" in note and "nothing to switch off" in note for note in cfg.adjustments)
    with pytest.raises(ConfigError, match="--one-logger-project: NVIDIA cluster tooling"):
        parse_args(["--mock-data", "--one-logger-project", "p"])


def test_no_check_for_nan_in_loss_and_grad_is_parsed() -> None:
    assert parse_args(["--mock-data", "--no-check-for-nan-in-loss-and-grad"]).run.no_check_for_nan_in_loss_and_grad
    assert not parse_args(["--mock-data"]).run.no_check_for_nan_in_loss_and_grad
