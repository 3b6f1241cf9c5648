"""``--defer-embedding-wgrad-compute`` and ``--wgrad-deferral-limit``: taken as Megatron-LM takes them, handed to
Megatron-Core's config, and refused, with the reason, where Megatron-Core would fail: without a pipeline, without
the fused weight-gradient GEMMs it runs the deferred ones as, on CPU, or without apex's kernel its drain calls."""

from __future__ import annotations

import importlib.util
import io
import json
from typing import Any

import pytest
import torch

from megatron_ext.config.arguments import ConfigError
from megatron_ext.config.training_config import parse_args

pytestmark = pytest.mark.unit

DEFER = ["--mock-data", "--pipeline-model-parallel-size", "2", "--defer-embedding-wgrad-compute"]


def test_the_flags_are_megatron_lms_and_checked_before_launch() -> None:
    cfg = parse_args([*DEFER, "--wgrad-deferral-limit", "22", "--device", "cuda"], world_size=2)
    assert cfg.parallel.defer_embedding_wgrad_compute and cfg.parallel.wgrad_deferral_limit == 22
    assert parse_args(["--mock-data"]).parallel.wgrad_deferral_limit == 0  # Megatron-LM's default: every microbatch
    for argv, why in (
        (["--mock-data", "--defer-embedding-wgrad-compute", "--device", "cuda"], "there is no pipeline: give "
         "--pipeline-model-parallel-size 2 or more"),
        ([*DEFER, "--no-gradient-accumulation-fusion", "--device", "cuda"], "--no-gradient-accumulation-fusion "
         "turns off: drop one"),
        ([*DEFER, "--device", "cpu"], "apex's fused weight-gradient kernel .* this run is on CPU"),
    ):  # fmt: skip
        with pytest.raises(ConfigError, match=why):
            parse_args(argv, world_size=2)
    with pytest.raises(ConfigError, match="wgrad-deferral-limit"):
        parse_args([*DEFER, "--wgrad-deferral-limit", "-1"], world_size=2)


def _with_apex(monkeypatch: pytest.MonkeyPatch, present: bool) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        if name == "fused_weight_gradient_mlp_cuda":
            return object() if present else None
        return real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_the_run_needs_apexs_kernel_and_hands_both_flags_to_megatron_core(monkeypatch: pytest.MonkeyPatch) -> None:
    """Megatron-Core's drain (``drain_embedding_wgrad_compute``) imports apex's ``fused_weight_gradient_mlp_cuda``
    whatever the layers: without it the run stops before building anything, naming it; with it the config carries
    the flags, which Megatron-Core's own check accepts with the fused weight-gradient GEMMs and refuses without, as
    ours does."""
    from megatron.core.model_parallel_config import ModelParallelConfig

    from megatron_ext.training import model

    cfg = parse_args([*DEFER, "--wgrad-deferral-limit", "22", "--device", "cuda"], world_size=2)
    _with_apex(monkeypatch, present=False)
    with pytest.raises(ConfigError, match="apex's kernel is not installed; run on GPUs with apex's CUDA extensions"):
        model.check_transformer_engine(cfg, torch.device("cuda"))
    with pytest.raises(ConfigError, match="this run is on CPU"):
        model.check_transformer_engine(cfg, torch.device("cpu"))
    _with_apex(monkeypatch, present=True)
    model.check_transformer_engine(cfg, torch.device("cuda"))
    args = model.transformer_config_arguments(cfg, torch.device("cuda"))
    assert (args["defer_embedding_wgrad_compute"], args["wgrad_deferral_limit"]) == (True, 22)
    assert args["gradient_accumulation_fusion"]
    ModelParallelConfig(
        pipeline_model_parallel_size=2, defer_embedding_wgrad_compute=True, wgrad_deferral_limit=22,
        gradient_accumulation_fusion=True, pipeline_dtype=torch.float32,
    )  # fmt: skip
    with pytest.raises(ValueError, match="gradient accumulation fusion"):
        ModelParallelConfig(
            pipeline_model_parallel_size=2, defer_embedding_wgrad_compute=True, pipeline_dtype=torch.float32
        )
    with pytest.raises(ValueError, match="pipeline model parallel is not used"):
        ModelParallelConfig(defer_embedding_wgrad_compute=True, gradient_accumulation_fusion=True)


def _calculator(argv: list[str]) -> tuple[int, str, str]:
    from megatron_ext.cli.layout import main

    out, err = io.StringIO(), io.StringIO()
    return main(argv, stdout=out, stderr=err), out.getvalue(), err.getvalue()


def test_the_calculator_takes_them_says_what_it_leaves_out_and_emits_them_where_a_pipeline_is() -> None:
    """A launch script's flags reach the calculator: it prices the step as without them and says so (its buffers
    and its drain, docs/layout-model.md), refuses one layout without a pipeline as Megatron-Core does, and prints
    them in the ``pretrain_gpt.py`` command of a layout with a pipeline, not of one without."""
    common = ["--gpus", "64", "--model", "llama3.1-70b", "--bf16", "--micro-batch-size", "1", "--sequence-parallel",
              "--use-distributed-optimizer", "--recompute-granularity", "selective"]  # fmt: skip
    deferral = ["--defer-embedding-wgrad-compute", "--wgrad-deferral-limit", "22"]
    code, out, _ = _calculator([*common, *deferral, "--tp", "4", "--pp", "8", "--global-batch-size", "128", "--json"])
    assert code == 0
    doc = json.loads(out)
    assert any(
        line.startswith("--defer-embedding-wgrad-compute: priced as without it") for line in doc["approximations"]
    )
    flags = doc["layouts"][0]["pretrain_flags"].split()
    assert flags[flags.index("--wgrad-deferral-limit") + 1] == "22" and "--defer-embedding-wgrad-compute" in flags
    cfg = parse_args([*flags, "--mock-data", "--device", "cuda"], world_size=64)
    assert cfg.parallel.defer_embedding_wgrad_compute and cfg.parallel.wgrad_deferral_limit == 22
    plain = _calculator([*common, "--tp", "4", "--pp", "8", "--global-batch-size", "128", "--json"])[1]
    assert json.loads(plain)["layouts"][0]["step_time_s"] == doc["layouts"][0]["step_time_s"]
    code, _, err = _calculator([*common, *deferral, "--tp", "8", "--pp", "1", "--global-batch-size", "128"])
    assert code != 0 and "there is no pipeline" in err
    # What does not depend on the layout is refused in the search too, as pretrain_gpt.py would refuse every layout.
    code, _, err = _calculator([*common, *deferral, "--no-gradient-accumulation-fusion", "--global-batch-size", "128"])
    assert code != 0 and "Megatron-Core refuses the pair" in err
    # A search ranking layouts with and without a pipeline (GPT-3 1.3B on 8 GPUs) prints runs pretrain_gpt.py takes.
    code, out, _ = _calculator(["--gpus", "8", "--model", "gpt3-1.3b", "--bf16", *deferral, "--top", "5", "--json"])
    assert code == 0
    records = json.loads(out)["layouts"]
    assert {r["pp"] > 1 for r in records} == {True, False}
    for record in records:
        assert ("--defer-embedding-wgrad-compute" in record["pretrain_flags"]) == (record["pp"] > 1), record
