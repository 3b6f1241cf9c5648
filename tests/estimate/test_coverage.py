"""Every flag that can change a step's memory or time is modelled, approximated with a note the dry run prints,
or of no effect with the reason (megatron_ext/estimate/coverage.py)."""

from __future__ import annotations

import dataclasses

import pytest

from megatron_ext.config.training_config import parse_args
from megatron_ext.estimate import coverage
from megatron_ext.estimate.derived_numbers import describe

pytestmark = pytest.mark.unit


def test_every_flag_of_the_step_is_classified() -> None:
    names = {f.name for group in coverage.STEP_GROUPS for f in dataclasses.fields(group)}
    unclassified = []
    for group in coverage.STEP_GROUPS:
        for field in dataclasses.fields(group):
            try:
                coverage.classification(group, field.name)
            except KeyError as exc:
                unclassified.append(str(exc))
    assert unclassified == []
    # Nothing classified twice or left over from a removed flag.
    assert not set(coverage.APPROXIMATED) & set(coverage.NO_EFFECT)
    assert set(coverage.APPROXIMATED) | set(coverage.NO_EFFECT) <= names
    modelled = {f.name for g in coverage.STEP_GROUPS for f in dataclasses.fields(g) if f.metadata.get("estimate")}
    assert not modelled & (set(coverage.APPROXIMATED) | set(coverage.NO_EFFECT))
    assert set(coverage.PARTLY_MODELLED) <= modelled
    # bf16 gradient buffers and Q/K/V-only biases: in the memory model and the calculator's flags.
    assert {"grad_reduce_in_bf16", "add_qkv_bias"} <= modelled


def test_the_dry_run_names_each_approximation_in_use() -> None:
    base = ["--mock-data", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4"]
    assert not any("approximate" in line for line in describe(parse_args(base)))
    lines = describe(parse_args([*base, "--squared-relu", "--optimizer", "sgd"]))
    approximated = [line for line in lines if line.startswith("the memory and time estimates approximate")]
    assert approximated == [
        "the memory and time estimates approximate --squared-relu: memory and time as GeLU's (the MLP keeps its "
        "input either way)",
        "the memory and time estimates approximate --optimizer: optimizer memory is Adam's (two fp32 moments); SGD "
        "keeps one or none, Muon and Lion one on most weights, less than estimated; SOAP also keeps preconditioners, "
        "more; Muon's Newton-Schulz is not timed",
    ]


def test_the_calculator_takes_every_approximated_flag_says_how_and_carries_it_into_the_command() -> None:
    """A flag the estimate approximates is taken (not refused as unknown), named in one line of the output, and
    kept in the printed pretrain_gpt.py command: --squared-relu trains another model than GeLU."""
    import io
    import json
    import shlex

    from megatron_ext.cli import layout_args
    from megatron_ext.cli.layout import main as layout_tool

    parser = layout_args.build_parser()
    known = {option for action in parser._actions for option in action.option_strings}
    for group in coverage.STEP_GROUPS:
        for field in dataclasses.fields(group):
            if field.name in coverage.APPROXIMATED:
                assert f"--{field.name.replace('_', '-')}" in known, field.name
    out = io.StringIO()
    argv = ["--model", "gpt3-1.3b", "--gpus", "16", "--global-batch-size", "64", "--bf16", "--tp", "2",
            "--squared-relu", "--optimizer", "sgd", "--no-bias-gelu-fusion", "--rampup-batch-size", "16", "16", "1000",
            "--json"]  # fmt: skip
    assert layout_tool(argv, stdout=out, stderr=io.StringIO()) == 0
    doc = json.loads(out.getvalue())
    assert doc["approximations"] == [
        f"--squared-relu: {coverage.APPROXIMATED['squared_relu']}",
        f"--no-bias-gelu-fusion: {coverage.APPROXIMATED['no_bias_gelu_fusion']}",
        f"--optimizer: {coverage.APPROXIMATED['optimizer']}",
        f"--rampup-batch-size: {coverage.APPROXIMATED['rampup_batch_size']}",
    ]
    command = shlex.split(doc["layouts"][0]["pretrain_flags"])
    cfg = parse_args([*command, "--mock-data", "--train-samples", "100000"], world_size=16)  # ramp-up: in samples
    assert cfg.model.squared_relu and cfg.model.no_bias_gelu_fusion and cfg.optim.optimizer == "sgd"
    assert cfg.batch.rampup_batch_size == (16, 16, 1000)
