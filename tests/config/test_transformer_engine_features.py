"""FP8 and TP communication overlap: Megatron-LM's flags reach Megatron-Core's configs and Transformer Engine's
userbuffers as Megatron-LM passes them (Transformer Engine mocked as present), and are refused, with the reason,
where Transformer Engine's layers are not built."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
import torch

from megatron_ext.config.arguments import ConfigError
from megatron_ext.config.training_config import parse_args

pytestmark = pytest.mark.unit

FP8 = """--mock-data --bf16 --fp8-format hybrid --fp8-recipe delayed --fp8-margin 1 --fp8-amax-history-len 1024
    --fp8-amax-compute-algo max --disable-fp8-wgrad --fp8-param-gather --use-distributed-optimizer
    --tensor-model-parallel-size 2 --sequence-parallel --tp-comm-overlap --world-size 4""".split()


def test_the_flags_are_megatron_lms_and_checked_before_launch() -> None:
    cfg = parse_args(FP8)  # a --dry-run for a GPU cluster: accepted
    o = cfg.optim
    assert (o.fp8_format, o.fp8_recipe, o.fp8_margin, o.fp8_amax_history_len) == ("hybrid", "delayed", 1, 1024)
    assert o.no_fp8_wgrad and o.fp8_param_gather and cfg.parallel.tp_comm_overlap
    for extra, why in (
        (["--device", "cpu"], "--device cpu"),
        (["--transformer-impl", "local"], "--transformer-impl local"),
    ):
        with pytest.raises(
            ConfigError,
            match=f"--fp8-format hybrid and --tp-comm-overlap need Transformer Engine's layers, which {why}",
        ):
            parse_args([*FP8, *extra])  # fmt: skip
    no_sp = [flag for flag in FP8 if flag != "--sequence-parallel"]
    with pytest.raises(
        ConfigError, match=r"--tp-comm-overlap overlaps sequence parallelism's .* give --sequence-parallel"
    ):
        parse_args(no_sp)
    with pytest.raises(ConfigError, match="--fp8-param-gather all-gathers the distributed optimizer's weights"):
        parse_args([f for f in FP8 if f != "--use-distributed-optimizer"])
    with pytest.raises(ConfigError, match="--fp8-param-gather and --no-fp8-wgrad apply with --fp8-format only"):
        parse_args(["--mock-data", "--fp8-param-gather", "--no-fp8-wgrad"])


def test_they_reach_transformer_config_and_ddp_as_megatron_lm_passes_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from megatron_ext.training import model

    monkeypatch.setattr(model, "use_transformer_engine", lambda cfg, device: True)
    cfg = parse_args(FP8)
    args = model.transformer_config_arguments(cfg, torch.device("cuda"))
    assert {k: args[k] for k in ("fp8", "fp8_recipe", "fp8_margin", "fp8_amax_history_len", "fp8_amax_compute_algo",
                                 "fp8_wgrad", "fp8_param", "tp_comm_overlap", "tp_comm_bootstrap_backend")} == {
        "fp8": "hybrid", "fp8_recipe": "delayed", "fp8_margin": 1, "fp8_amax_history_len": 1024,
        "fp8_amax_compute_algo": "max", "fp8_wgrad": False, "fp8_param": True, "tp_comm_overlap": True,
        "tp_comm_bootstrap_backend": "nccl",
    }  # fmt: skip
    assert model.ddp_config(cfg).fp8_param_gather
    plain = model.transformer_config_arguments(parse_args(["--mock-data"]), torch.device("cuda"))
    assert plain["fp8"] is None and not plain["tp_comm_overlap"] and plain["fp8_wgrad"]
    model.check_transformer_engine(cfg, torch.device("cuda"))  # TE "built": nothing to refuse


def test_without_transformer_engine_the_run_stops_naming_why() -> None:
    from megatron_ext.training import model

    with pytest.raises(
        ConfigError,
        match="--fp8-format hybrid and --tp-comm-overlap need Transformer Engine's layers, and this run is on CPU",
    ):
        model.check_transformer_engine(parse_args(FP8), torch.device("cpu"))  # fmt: skip


@pytest.mark.parametrize("te_27", [True, False], ids=["te-2.7-quantization-modes", "te-1.9-use-fp8"])
def test_userbuffers_are_set_up_as_megatron_lm_sets_them_up(te_27: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from megatron_ext.training import model

    calls: list[dict[str, Any]] = []
    base = types.SimpleNamespace(initialize_ub=lambda **kw: calls.append(kw))
    if te_27:
        base.UserBufferQuantizationMode = types.SimpleNamespace(FP8="FP8", NONE="NONE")  # type: ignore[attr-defined]
    te = types.ModuleType("transformer_engine")
    te_pytorch = types.ModuleType("transformer_engine.pytorch")
    te_pytorch.module = types.SimpleNamespace(base=base)  # type: ignore[attr-defined]
    te.pytorch = te_pytorch  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "transformer_engine", te)
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch", te_pytorch)
    cfg = parse_args([*FP8, "--seq-length", "4096", "--micro-batch-size", "2", "--hidden-size", "1024",
                      "--num-attention-heads", "16", "--tp-comm-bootstrap-backend", "gloo"])  # fmt: skip
    model.initialize_tp_comm_overlap(cfg)
    expected: dict[str, Any] = {"shape": [8192, 1024], "tp_size": 2, "ub_cfgs": {}, "bootstrap_backend": "gloo"}
    expected |= {"quantization_modes": ["FP8"]} if te_27 else {"use_fp8": True}
    assert calls == [expected]
    model.initialize_tp_comm_overlap(parse_args(["--mock-data"]))  # without --tp-comm-overlap: nothing
    assert len(calls) == 1


def test_the_overlaps_switches_and_userbuffer_settings_reach_transformer_engine(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from megatron_ext.training import model

    monkeypatch.setattr(model, "use_transformer_engine", lambda cfg, device: True)
    names = ("overlap_ag", "overlap_rs", "split_ag", "split_rs", "bulk_dgrad", "bulk_wgrad")
    default = model.transformer_config_arguments(parse_args(FP8), torch.device("cuda"))
    assert all(default[f"tp_comm_{n}"] for n in names) and not default["tp_comm_overlap_rs_dgrad"]
    # Megatron-LM's two spellings of each switch (--no-tp-comm-X, --disable-tp-comm-X) turn it off.
    off = [f"--{'no' if i % 2 else 'disable'}-tp-comm-{n.replace('_', '-')}" for i, n in enumerate(names)]
    args = model.transformer_config_arguments(
        parse_args([*FP8, *off, "--tp-comm-overlap-rs-dgrad"]), torch.device("cuda")
    )
    assert not any(args[f"tp_comm_{n}"] for n in names) and args["tp_comm_overlap_rs_dgrad"]
    settings = tmp_path / "ub.yaml"
    settings.write_text("qkv_fprop:\n  method: ring_exchange\nfc2_fprop:\n  method: pipeline\n  num_splits: 4\n")
    assert model.userbuffer_settings(str(settings)) == {
        "qkv_fprop": {"method": "ring_exchange"},
        "fc2_fprop": {"method": "pipeline", "num_splits": 4},
    }
    assert model.userbuffer_settings(None) == {}
    (tmp_path / "list.yaml").write_text("- a\n")
    for bad, why in ((tmp_path / "missing.yaml", "No such file"), (tmp_path / "list.yaml", "not a YAML mapping")):
        with pytest.raises(ConfigError, match=f"--tp-comm-overlap-cfg {bad}: .*{why}"):
            model.userbuffer_settings(str(bad))
