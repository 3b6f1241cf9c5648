"""Megatron-Core's emerging optimizers' flags (``config/emerging_optimizer_args.py``): Megatron-LM's names reach
Megatron-Core's ``OptimizerConfig``, and what Megatron-Core 0.19.2 cannot train is refused in one line."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from megatron_ext.config.arguments import ConfigError
from megatron_ext.config.emerging_optimizer_args import NS_COEFFICIENTS, EmergingOptimizerArgs
from megatron_ext.config.optimizer_args import OptimizerArgs
from megatron_ext.config.training_config import parse_args

pytestmark = pytest.mark.unit

BASE = ["--mock-data", "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64"]


def test_the_coefficient_choices_are_the_installed_packages() -> None:
    from emerging_optimizers.orthogonalized_optimizers.muon_utils import NSCoeffT

    # "custom" takes coefficients that no flag gives.
    assert set(NS_COEFFICIENTS) == set(typing.get_args(NSCoeffT)) - {"custom"}


def test_every_flag_reaches_megatron_cores_optimizer_config() -> None:
    """Each field is Megatron-Core's OptimizerConfig field of the same name (``--muon-no-split-qkv`` negated)."""
    import torch

    from megatron_ext.training.optimizer_scheduler import optimizer_config_of

    argv = [
        *BASE, "--optimizer", "muon", "--muon-momentum", "0.8", "--muon-no-split-qkv", "--muon-nesterov",
        "--muon-scale-mode", "unit_rms_norm", "--muon-fp32-matmul-prec", "high", "--muon-coefficient-type", "aol",
        "--muon-num-ns-steps", "3", "--muon-tp-mode", "duplicated", "--muon-extra-scale-factor", "0.5",
        "--muon-scalar-optimizer", "lion", "--lion-beta1", "0.9", "--lion-beta2", "0.97",
    ]  # fmt: skip
    cfg = parse_args(argv)
    config = optimizer_config_of(cfg, params_dtype=torch.float32, timers=None)
    given = {f.name: getattr(cfg.optim, f.name) for f in dataclasses.fields(EmergingOptimizerArgs)}
    for name, value in given.items():
        if name == "muon_no_split_qkv":
            assert config.muon_split_qkv is (not value)
        elif name != "no_use_layer_wise_param_layout":  # DDP's layout, not the optimizer's (training/model.py)
            assert getattr(config, name) == value, name
    assert config.optimizer == "muon" and config.muon_coefficient_type == "aol" and config.muon_num_ns_steps == 3


def test_the_distributed_optimizer_becomes_megatron_cores_layer_wise_one() -> None:
    import torch

    from megatron_ext.training.optimizer_scheduler import optimizer_config_of

    argv = [*BASE, "--optimizer", "muon", "--use-distributed-optimizer", "--bf16", "--world-size", "2"]
    config = optimizer_config_of(parse_args(argv), params_dtype=torch.bfloat16, timers=None)
    assert (config.use_layer_wise_distributed_optimizer, config.use_distributed_optimizer) == (True, False)
    adam = optimizer_config_of(parse_args(argv[:-6] + argv[-4:]), params_dtype=torch.bfloat16, timers=None)
    assert (adam.use_layer_wise_distributed_optimizer, adam.use_distributed_optimizer) == (False, True)


def test_megatron_lm_defaults_are_kept() -> None:
    """Megatron-LM's defaults, where they differ from OptimizerConfig's (its --muon-momentum is 0.9, not 0.95)."""
    optim = parse_args([*BASE, "--optimizer", "muon"]).optim
    assert (optim.muon_momentum, optim.muon_tp_mode, optim.muon_scale_mode) == (0.9, "blockwise", "spectral")


def test_the_removed_nesterov_spelling_is_taken_as_the_new_one() -> None:
    old = parse_args([*BASE, "--optimizer", "muon", "--muon-use-nesterov"])
    assert old.optim.muon_nesterov
    assert any(note.startswith("--muon-use-nesterov") for note in old.adjustments)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        ("--optimizer dist_muon", "give --optimizer muon --use-distributed-optimizer"),
        ("--optimizer adaptive_muon", "never sets the scale_mode"),
        ("--optimizer lion --fp16", "does not train with --fp16 in Megatron-Core; use --bf16"),
        ("--optimizer soap --use-distributed-optimizer --world-size 2", "add --bf16"),
        ("--optimizer soap --save ckpt", "cannot checkpoint SOAP's preconditioners"),
    ],
)
def test_what_megatron_core_cannot_train_is_refused_in_one_line(flags: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_args([*BASE, *flags.split()])
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_momentum_bounds_are_checked() -> None:
    with pytest.raises(ConfigError, match="--muon-momentum must be less than 1"):
        OptimizerArgs(optimizer="muon", muon_momentum=1.0)
