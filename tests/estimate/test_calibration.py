"""``tools/layout.py --calibrate``: the run record, reading metrics files, the fit, and profile files.

The fit is checked on times the model itself predicts for a known profile: from a base profile far from it,
the fit must find the values back where the runs constrain them and keep the base's where they do not. The
end-to-end check on measured CPU runs is ``tests/bench/test_calibration_bench.py``.
"""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import pytest

from megatron_ext.cli.layout import main as layout_main
from megatron_ext.config.training_config import parse_args
from megatron_ext.estimate.calibration import (
    RUN_RECORD,
    CalibrationError,
    Case,
    MeasuredRun,
    cpu_profile,
    fit_profile,
    predicted_times,
    read_runs,
    run_record,
)
from megatron_ext.estimate.hardware import GIB, get_profile, profile_document
from megatron_ext.estimate.search import Cluster, evaluate
from megatron_ext.estimate.workload import Workload

pytestmark = pytest.mark.unit

MODEL = (
    "--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 "
    "--micro-batch-size 1 --global-batch-size 8 --mock-data --device cpu"
).split()

TRUE = dataclasses.replace(
    cpu_profile(memory_bytes=12 * GIB),
    compute_efficiency=0.3,
    memory_bandwidth=1.6e9,
    link_latency_s=1.2e-3,
    intra_node_bandwidth=4e8,
)
"""The profile the synthetic runs ran on."""


def _case(flags: list[str], world_size: int, profile=TRUE) -> Case:
    """A run of ``flags`` whose measured times are what ``profile`` predicts for it."""
    cfg = parse_args([*MODEL, *flags], world_size=world_size)
    record = run_record(cfg, gpus_per_node=world_size, device="cpu", device_memory_bytes=12 * GIB)[RUN_RECORD]
    workload = Workload.of_config(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_size=1024)))
    times = predicted_times(workload, cfg.layout, Cluster(gpus=world_size, gpus_per_node=world_size, gpu=profile))
    if "--use-distributed-optimizer" in flags:
        del times["optimizer"]  # its timer holds the parameter all-gather too (calibration.read_runs)
    run = MeasuredRun(
        source=" ".join(flags) or "single",
        calculator_flags=tuple(record["calculator_flags"]),
        world_size=world_size,
        gpus_per_node=world_size,
        device="cpu",
        device_memory_bytes=12 * GIB,
        iterations=5,
        times=times,
    )
    return Case(run=run, workload=workload, layout=cfg.layout)


def test_the_fit_finds_the_profile_back_from_two_layouts() -> None:
    cases = [_case(["--tensor-model-parallel-size", "2"], 2), _case(["--use-distributed-optimizer"], 2)]
    calibration = fit_profile(cpu_profile(memory_bytes=12 * GIB), cases, name="mine")
    fitted = calibration.profile
    assert set(calibration.fitted) == {"compute_efficiency", "memory_bandwidth", "link_latency_s",
                                       "intra_node_bandwidth"}  # fmt: skip
    for field in calibration.fitted:
        assert getattr(fitted, field) == pytest.approx(getattr(TRUE, field), rel=0.02), field
    # No run spans nodes; neither the element-wise kernels' share nor a pass's fixed overhead can be told from the
    # GEMMs' rate at one micro-batch size.
    assert set(calibration.kept) == {"inter_node_bandwidth", "memory_efficiency", "pass_overhead_s"}
    assert fitted.inter_node_bandwidth == cpu_profile(memory_bytes=1).inter_node_bandwidth
    assert all(predicted == pytest.approx(measured, rel=0.01) for *_, measured, predicted in calibration.rows)
    # A layout it was not fitted on, predicted as the true profile predicts it.
    pp2 = _case(["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"], 2)
    cluster = Cluster(gpus=2, gpus_per_node=2, gpu=fitted)
    assert evaluate(pp2.workload, pp2.layout, cluster).time.step_s == pytest.approx(pp2.run.times["step"], rel=0.02)
    assert fitted.name == "mine" and "calibrated on 2 run(s)" in fitted.description


def test_a_second_micro_batch_size_tells_the_pass_overhead_from_the_gemm_rate() -> None:
    true = dataclasses.replace(TRUE, pass_overhead_s=5e-3)
    tp2 = _case(["--tensor-model-parallel-size", "2"], 2, true)
    dp2 = _case(["--use-distributed-optimizer"], 2, true)
    base = cpu_profile(memory_bytes=12 * GIB)
    assert "pass_overhead_s" in fit_profile(base, [tp2, dp2], name="two").kept
    dp2_mbs2 = _case(["--use-distributed-optimizer", "--micro-batch-size", "2"], 2, true)
    calibration = fit_profile(base, [tp2, dp2, dp2_mbs2], name="three")
    assert "pass_overhead_s" in calibration.fitted
    for field in ("pass_overhead_s", "compute_efficiency", "link_latency_s"):
        assert getattr(calibration.profile, field) == pytest.approx(getattr(true, field), rel=0.02), field


def test_a_run_that_exercises_no_link_keeps_the_links_of_the_base() -> None:
    base = cpu_profile(memory_bytes=12 * GIB)
    calibration = fit_profile(base, [_case([], 1)], name="one")
    assert {"intra_node_bandwidth", "inter_node_bandwidth", "link_latency_s"} <= set(calibration.kept)
    assert calibration.profile.link_latency_s == base.link_latency_s
    assert "compute_efficiency" in calibration.fitted


def test_runs_faster_than_the_base_peak_raise_the_peak() -> None:
    fast = dataclasses.replace(TRUE, peak_flops=1e12, peak_flops_fp32=1e12, compute_efficiency=0.8)
    calibration = fit_profile(cpu_profile(memory_bytes=12 * GIB), [_case([], 1, fast)], name="fast")
    profile = calibration.profile
    assert profile.compute_efficiency == 1.0
    assert profile.peak_flops_fp32 == pytest.approx(0.8e12, rel=0.02)
    assert profile.problems() == []


@pytest.mark.parametrize(
    "flags, world_size",
    [
        (["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"], 2),
        (["--tensor-model-parallel-size", "2", "--sequence-parallel", "--use-distributed-optimizer"], 4),
        (["--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "3"], 2),
        (["--recompute-granularity", "full", "--recompute-method", "uniform", "--overlap-grad-reduce"], 2),
    ],
)
def test_the_run_record_rebuilds_the_runs_layout_and_workload(flags: list[str], world_size: int) -> None:
    from megatron_ext.cli import layout_calibrate

    cfg = parse_args([*MODEL, *flags], world_size=world_size)
    record = run_record(cfg, gpus_per_node=2, device="cpu", device_memory_bytes=GIB)[RUN_RECORD]
    measured = MeasuredRun(source="r", calculator_flags=tuple(record["calculator_flags"]), world_size=world_size,
                           gpus_per_node=2, device="cpu", device_memory_bytes=GIB, iterations=2, times={})  # fmt: skip
    case = layout_calibrate._case(measured)
    assert case.layout == dataclasses.replace(cfg.layout, gpus_per_node=2)  # the record's cluster
    assert case.workload.padded_vocab_size(cfg.layout.tp) == cfg.padded_vocab_size  # the null tokenizer's id too
    assert case.workload.recompute_granularity == (cfg.optim.recompute_granularity or "none")
    assert case.workload.overlap_grad_reduce == cfg.parallel.overlap_grad_reduce


def _metrics(path: Path, *runs: list[float], record: bool = True, level: int = 2) -> Path:
    lines = []
    for elapsed in runs:
        if record:
            cfg = parse_args(MODEL, world_size=1)
            lines.append(run_record(cfg, gpus_per_node=1, device="cpu", device_memory_bytes=GIB))
            lines[-1][RUN_RECORD]["timing_log_level"] = level
        for i, ms in enumerate(elapsed, 1):
            timers = {
                "optimizer": ms / 10,
                **({"forward-compute": ms / 3, "backward-compute": ms / 2} if level > 1 else {}),
            }
            lines.append({"iteration": i, "lm_loss": 7.0, "elapsed_ms": ms, "time_ms": timers})
        lines.append({"iteration": len(elapsed), "valid_loss": 7.0})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_read_runs_skips_warm_up_and_takes_medians(tmp_path: Path) -> None:
    (run,) = read_runs(_metrics(tmp_path / "m.jsonl", [900.0, 100.0, 300.0, 200.0, 250.0, 5000.0]))
    # The first third (2 of 6) is warm-up; the median of 300, 200, 250, 5000.
    assert run.iterations == 4
    assert run.times["step"] == pytest.approx(0.275)
    assert run.times["compute"] == pytest.approx(0.275 * 5 / 6)
    assert run.times["optimizer"] == pytest.approx(0.0275)
    assert run.world_size == 1 and run.device == "cpu"


def test_a_file_appended_by_two_runs_holds_both(tmp_path: Path) -> None:
    runs = read_runs(_metrics(tmp_path / "m.jsonl", [100.0, 100.0, 100.0], [200.0, 200.0, 200.0]))
    assert [r.source.rsplit(" ", 4)[-4:] for r in runs] == [["(run", "1", "of", "2)"], ["(run", "2", "of", "2)"]]
    assert [r.times["step"] for r in runs] == [0.1, 0.2]


def test_level_one_timers_give_the_step_and_optimizer_only(tmp_path: Path) -> None:
    (run,) = read_runs(_metrics(tmp_path / "m.jsonl", [100.0, 100.0, 100.0], level=1))
    assert set(run.times) == {"step", "optimizer"}


@pytest.mark.parametrize(
    "write, message",
    [
        (lambda p: _metrics(p, [100.0, 100.0], record=False), "no run record"),
        (lambda p: _metrics(p, [100.0]), "two iterations"),
        (lambda p: p.write_text('{"iteration": 1}\nnot json\n'), "line 2: not JSON"),
        (lambda p: None, "cannot read it"),
    ],
)
def test_unusable_metrics_are_refused_naming_the_file(tmp_path: Path, write, message: str) -> None:
    path = tmp_path / "m.jsonl"
    write(path)
    with pytest.raises(CalibrationError, match=message) as caught:
        read_runs(path)
    assert str(path) in str(caught.value)


def _without_calculator_flags(path: Path) -> None:
    _metrics(path, [100.0, 100.0, 100.0])
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    del lines[0][RUN_RECORD]["calculator_flags"]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


@pytest.mark.parametrize(
    "elapsed",
    [[0.0, 0.0, 0.0], [-5.0, -5.0, -5.0], ["fast", "fast", "fast"], [float("nan")] * 3],
    ids=["zero", "negative", "text", "nan"],
)
def test_times_that_are_no_positive_numbers_are_refused_naming_the_file(tmp_path: Path, elapsed: list) -> None:
    """Before: text in elapsed_ms ended in a TypeError traceback, and times that were all unusable in "max()
    iterable argument is empty"."""
    path = _metrics(tmp_path / "m.jsonl", [100.0] * len(elapsed))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line, ms in zip((line for line in lines if "elapsed_ms" in line), elapsed, strict=True):
        line["elapsed_ms"] = ms
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(CalibrationError, match="no logged iteration has a positive elapsed_ms") as caught:
        read_runs(path)
    assert str(path) in str(caught.value)


def test_a_run_record_without_the_calculators_flags_is_refused_naming_the_key(tmp_path: Path) -> None:
    """Before: a KeyError traceback."""
    path = tmp_path / "m.jsonl"
    _without_calculator_flags(path)
    with pytest.raises(CalibrationError, match="its run record lacks calculator_flags"):
        read_runs(path)


def test_calibrate_refuses_the_flags_it_would_ignore(tmp_path: Path) -> None:
    """Before: --json (and any layout or model flag) was dropped without a word: the output was text."""
    metrics = _metrics(tmp_path / "m.jsonl", [400.0] * 3)
    code, _, err = _layout("--calibrate", str(metrics), "--profile-out", str(tmp_path / "p.json"), "--json",
                           "--gpus", "64")  # fmt: skip
    assert code == 2 and "drop --gpus --json" in err
    assert not (tmp_path / "p.json").exists()


def test_a_profile_file_round_trips_through_gpu(tmp_path: Path) -> None:
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(profile_document(TRUE, calibration={"runs": []})))
    assert get_profile(str(path)) == TRUE


@pytest.mark.parametrize(
    "document, message",
    [
        ({"profile": {}}, "not a profile file"),
        ({"format": "megatron_ext gpu profile 1", "profile": {"name": "x", "colour": 1}}, "unknown fields colour"),
        ({"format": "megatron_ext gpu profile 1", "profile": {"name": "x"}}, "missing .*peak_flops"),
    ],
)
def test_a_broken_profile_file_is_refused_saying_what_is_wrong(tmp_path: Path, document, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ValueError, match=message):
        get_profile(str(path))


def test_a_profile_file_with_impossible_values_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(profile_document(dataclasses.replace(TRUE, compute_efficiency=1.5))))
    with pytest.raises(ValueError, match=r"--compute-efficiency must be in \(0, 1\]"):
        get_profile(str(path))
    path.write_text(json.dumps(profile_document(dataclasses.replace(TRUE, peak_flops=float("nan")))))
    with pytest.raises(ValueError, match=r"peak FLOP/s \(--peak-tflops\) must be a positive number, got nan"):
        get_profile(str(path))


def _layout(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = layout_main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_calibrate_writes_a_profile_that_gpu_then_predicts_with(tmp_path: Path) -> None:
    metrics = _metrics(tmp_path / "m.jsonl", [400.0] * 6)
    profile = tmp_path / "mine.json"
    code, out, err = _layout("--calibrate", str(metrics), "--profile-out", str(profile))
    assert code == 0, err
    assert "fitted:" in out and f"wrote {profile}" in out
    assert "kept from the base" in out and "link_latency_s" in out  # one process: no link measured
    doc = json.loads(profile.read_text())
    assert doc["calibration"]["base_profile"] == "cpu" and doc["profile"]["name"] == "mine"
    code, out, err = _layout(*MODEL[:-3], "--vocab-size", "1024", "--tensor-model-parallel-size", "1", "--gpus", "1",
                             "--gpu", str(profile), "--json")  # fmt: skip
    assert code == 0, err
    step = json.loads(out)["layouts"][0]["step_time_s"]
    assert step == pytest.approx(0.4, rel=0.05)


def test_calibrate_never_overwrites_and_needs_an_output(tmp_path: Path) -> None:
    metrics = _metrics(tmp_path / "m.jsonl", [400.0] * 3)
    existing = tmp_path / "mine.json"
    existing.write_text("mine")
    code, _, err = _layout("--calibrate", str(metrics), "--profile-out", str(existing))
    assert code == 2 and "exists; it is not overwritten" in err
    assert existing.read_text() == "mine"
    code, _, err = _layout("--calibrate", str(metrics))
    assert code == 2 and "needs --profile-out FILE.json" in err
    code, _, err = _layout("--calibrate", str(metrics), "--profile-out", str(tmp_path / "mine.txt"))
    assert code == 2 and "name it FILE.json" in err
    code, _, err = _layout("--gpus", "8", "--model", "gpt3-1.3b", "--profile-out", str(tmp_path / "p.json"))
    assert code == 2 and "go with --calibrate" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.jsonl", "mine.json"]


def test_runs_on_different_devices_are_not_mixed_into_one_profile(tmp_path: Path) -> None:
    cpu = _metrics(tmp_path / "cpu.jsonl", [400.0] * 3)
    gpu = tmp_path / "gpu.jsonl"
    gpu.write_text(cpu.read_text().replace('"device": "cpu"', '"device": "NVIDIA H100 80GB HBM3"'))
    code, _, err = _layout("--calibrate", str(cpu), str(gpu), "--profile-out", str(tmp_path / "p.json"))
    assert code == 2 and "different devices (NVIDIA H100 80GB HBM3, cpu)" in err
    assert not (tmp_path / "p.json").exists()


def test_the_elastic_re_plan_ranks_layouts_with_a_profile_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from megatron_ext.cli import elastic
    from tests.cli.test_elastic import RECIPE

    profile = tmp_path / "cpu.json"
    profile.write_text(json.dumps(profile_document(TRUE)))
    code = elastic.main(["--world-size", "2", "--gpus-per-node", "2", "--gpu", str(profile),
                         "--recipe-world-size", "2", "--", *RECIPE])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "pretrain_args=" in out and "memory not checked" not in err


def test_the_run_record_of_a_run_with_its_own_tokenizer_pads_that_tokenizer_s_vocabulary() -> None:
    """A run with a tokenizer of its own has no --vocab-size: its record carries the tokenizer's vocabulary (the
    suite's runs on indexed data failed at their first record while it did not)."""
    cfg = dataclasses.replace(parse_args([*MODEL, "--tokenizer-type", "GPT2BPETokenizer"],
                                         world_size=1), tokenizer_vocab_size=50257)  # fmt: skip
    flags = run_record(cfg, gpus_per_node=1, device="cpu", device_memory_bytes=GIB)[RUN_RECORD]["calculator_flags"]
    assert flags[flags.index("--tokenizer-vocab-size") + 1] == "50257"
    assert Workload.of_config(cfg).padded_vocab_size(1) == cfg.padded_vocab_size == 50304
