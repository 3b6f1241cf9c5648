"""The GPU check (``scripts/gpu_check.sh``, ``bench/gpu_check.py``) rehearsed on CPU with tiny shapes, so that
the GPU never meets a script that was not run; a step past its budget is stopped and the others still run; the
wheels the GPU machine lacks are this environment's, without torch's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests import waits
from tests.conftest import REPO, _env, bench_env, script_module
from tests.waits import QUICK_S, RUN_S


def _fetch_gpu_wheels() -> ModuleType:
    """scripts/fetch_gpu_wheels.py as a module (scripts/ is not a package)."""
    return script_module("scripts/fetch_gpu_wheels.py", "fetch_gpu_wheels")


STEPS = ["throughput", "calculator", "kernels", "correctness"]


@pytest.mark.distributed
def test_the_cpu_rehearsal_runs_every_step_and_writes_the_figures(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = waits.run(
        ["bash", str(REPO / "scripts" / "gpu_check.sh"), str(out), "--cpu-rehearsal"], timeout=RUN_S, env=bench_env()
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert {step: s["status"] for step, s in summary["steps"].items()} == dict.fromkeys(STEPS, "ok")
    throughput = json.loads((out / "throughput.json").read_text())
    assert {(r["model"], r["attention"]) for r in throughput["runs"]} == {
        (m, a) for m in ("tiny", "tiny-wide") for a in ("sdpa", "unfused")
    }
    assert all(r["tokens_per_sec"] > 0 and r["iterations"] == 2 for r in throughput["runs"])
    calculator = json.loads((out / "calculator.json").read_text())["rows"]
    assert [r["profile"] for r in calculator] == [
        "h100-sxm",
        "h100-sxm",
        "calibrated on tiny",
        "calibrated on tiny-wide",
    ]
    assert all(r["predicted_step_s"] > 0 for r in calculator)
    kernels = json.loads((out / "kernels.json").read_text())
    assert len(kernels["gemms"]) == 10 and len(kernels["attention"]) == 2
    assert all(k["measured_tflops"] > 0 and k["modelled_tflops"] > 0 for k in kernels["gemms"] + kernels["attention"])
    correctness = json.loads((out / "correctness.json").read_text())
    assert correctness["resume_bit_exact"], correctness
    # bf16 on both sides: the two forwards round differently, by about one bf16 step of the largest logit.
    assert correctness["hf_relative_difference"] < 2e-2, correctness
    table = (out / "summary.md").read_text()
    assert "| tiny-wide-unfused |" in table and "Resumed bit for bit: True." in table


@pytest.mark.unit
def test_a_step_past_its_budget_is_stopped_and_reported(tmp_path: Path) -> None:
    command = [sys.executable, str(REPO / "bench" / "gpu_check.py"), "--out", str(tmp_path), "--cpu-rehearsal"]
    command += ["--step", "kernels", "--budget", "kernels=0.01"]
    proc = waits.run(command, timeout=QUICK_S, env=_env())
    assert proc.returncode == 1, proc.stdout + proc.stderr
    status = json.loads((tmp_path / "summary.json").read_text())["steps"]["kernels"]["status"]
    assert status == "stopped at its budget of 0.01 s"
    assert not (tmp_path / "kernels.json").exists()


@pytest.mark.unit
def test_a_budget_names_a_step() -> None:
    command = [sys.executable, str(REPO / "bench" / "gpu_check.py"), "--out", "/nonexistent", "--budget", "kernel=5"]
    proc = subprocess.run(command, capture_output=True, text=True, env=_env(), timeout=QUICK_S)
    assert proc.returncode == 2 and "--budget kernel=5: give STEP=SECONDS" in proc.stderr


@pytest.mark.unit
def test_the_wheels_for_the_gpu_are_the_check_s_packages_without_torch_s() -> None:
    closure = _fetch_gpu_wheels().closure
    wanted = closure(("megatron-core", "transformers"), leave_out=frozenset(closure(("torch",))))
    assert {"megatron-core", "transformers", "huggingface-hub", "tokenizers", "numpy"} <= set(wanted)
    assert not {"torch", "sympy", "networkx", "jinja2", "filelock"} & set(wanted)
