#!/usr/bin/env python3
"""What only a GPU can tell, in one command: throughput and memory, the calculator against the hardware, kernel
rates against the calculator's curves, and correctness on CUDA.

``scripts/gpu_check.sh OUT`` runs it on a GPU machine (taking the wheels it lacks from ``.whl/``);
``--cpu-rehearsal`` runs every step with tiny shapes on CPU processes, as the tests do, so that the GPU never
meets a script that was not run. Each step runs in a process of its own under its own time budget, so that one
failure or hang does not eat the others' time, and writes ``OUT/STEP.json``; ``OUT/summary.md`` is the table of
all of them and ``OUT/summary.json`` each step's status::

    python bench/gpu_check.py --out /tmp/gpu-check --cpu-rehearsal

Steps:

* ``throughput``: ``pretrain_gpt.py`` on mock data, bf16, local spec, one GPU: GPT-3 350M and 1.3B (Brown et al.
  2020) at sequence 2048, each with PyTorch's SDPA (``--attention-backend auto``) and Megatron-Core's unfused
  attention (``local``): tokens/s, TFLOP/s, MFU, peak memory allocated and reserved.
* ``calculator``: ``tools/layout.py`` on the same runs (the GPU's built-in profile): predicted step time and
  memory beside the measured; then ``--calibrate`` on one size's run and the calibrated profile's prediction
  of the other size.
* ``kernels``: the layer's GEMMs (forward, input and weight gradients; small and large token counts) and
  causal SDPA forward + backward by sequence length, measured against ``estimate.kernels``' curves.
* ``correctness``: a run stopped and resumed reproduces the uninterrupted losses bit for bit on the device; its
  checkpoint exported to Hugging Face gives ``transformers``' logits equal to Megatron-Core's forward.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from train_throughput import (
    REPO,
    child_env,
    model_flags,
    pretrain_command,
    run_variant,
    summarise,
)  # bench/ is sys.path[0]

STEPS = ("throughput", "calculator", "kernels", "correctness")


@dataclass(frozen=True)
class Plan:
    """The shapes and budgets of one kind of run: the GPU's, or the CPU rehearsal's."""

    models: tuple[str, ...]
    """``bench/train_throughput.py`` model names, smaller first."""
    run_flags: str
    """``pretrain_gpt.py`` flags of every throughput run, after the model's (split on spaces)."""
    attention: dict[str, str]
    """Attention variant name: its ``--attention-backend``."""
    iters: int
    warmup: int
    gemm_hidden: int
    """The GEMMs' hidden size (their ``k`` and ``n`` are multiples of it)."""
    gemm_tokens: tuple[int, ...]
    """Tokens per micro-batch of the GEMMs: the weight gradient's reduction dimension."""
    attention_lengths: tuple[int, ...]
    correctness_flags: str
    """A small model on the device, exportable to Hugging Face (``pretrain_gpt.py`` flags, split on spaces)."""
    budget_s: dict[str, int]
    """Each step's time limit, seconds."""
    device: str
    """``cuda`` or ``cpu``."""
    gpu: str | None
    """The calculator profile to compare with (None: the device's, found at run time)."""


GPU_PLAN = Plan(
    models=("gpt3-350m", "gpt3-1.3b"),
    run_flags=(
        "--bf16 --transformer-impl local --seq-length 2048 --micro-batch-size 4 --global-batch-size 32 --device cuda"
    ),
    attention={"sdpa": "auto", "unfused": "local"},
    iters=30,
    warmup=3,
    gemm_hidden=2048,
    gemm_tokens=(1024, 2048, 8192),
    attention_lengths=(512, 1024, 2048, 4096),
    correctness_flags=(
        "--num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 512 --vocab-size 1024 "
        "--micro-batch-size 4 --global-batch-size 16 --bf16 --device cuda"
    ),
    budget_s={"throughput": 270, "calculator": 30, "kernels": 60, "correctness": 120},
    device="cuda",
    gpu=None,
)
CPU_REHEARSAL = Plan(
    models=("tiny", "tiny-wide"),
    run_flags="--micro-batch-size 2 --global-batch-size 4 --device cpu",
    attention={"sdpa": "auto", "unfused": "local"},
    iters=2,
    warmup=1,
    gemm_hidden=64,
    gemm_tokens=(64, 256),
    attention_lengths=(64, 128),
    correctness_flags=(
        "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --vocab-size 255 "
        "--micro-batch-size 2 --global-batch-size 4 --bf16 --device cpu"
    ),
    budget_s={"throughput": 300, "calculator": 120, "kernels": 60, "correctness": 300},
    device="cpu",
    gpu="h100-sxm",  # nothing to compare a CPU with: the rehearsal runs the H100 comparison's code
)


def shape_flags(model: str) -> list[str]:
    """A model's shape flags; ``tiny-wide`` is the CPU rehearsal's second size."""
    if model == "tiny-wide":
        return [*model_flags("tiny"), "--hidden-size", "128"]
    return model_flags(model)


# ---------------------------------------------------------------------------------------------- the steps


def throughput(plan: Plan, out: Path) -> dict[str, Any]:
    runs = out / "throughput"
    runs.mkdir(exist_ok=True)
    rows = []
    for model in plan.models:
        for variant, backend in plan.attention.items():
            name = f"{model}-{variant}"
            args = [*shape_flags(model), *plan.run_flags.split(), "--attention-backend", backend]
            records = run_variant(
                name=name, args=args, nproc=1, iters=plan.iters, warmup=plan.warmup, timing_level=1, workdir=runs
            )
            result = asdict(summarise(name, args, records))
            result["peak_reserved_gb"] = max((r.get("peak_reserved_gb", 0.0) for r in records), default=None)
            result["model"], result["attention"], result["metrics_file"] = model, variant, str(runs / f"{name}.jsonl")
            rows.append(result)
    speedups = {
        model: by["sdpa"]["tokens_per_sec"] / by["unfused"]["tokens_per_sec"]
        for model in plan.models
        if (by := {r["attention"]: r for r in rows if r["model"] == model})
    }
    return {"runs": rows, "sdpa_speedup": speedups}


def _layout(args: Sequence[str]) -> dict[str, Any]:
    env = child_env()
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "layout.py"), *args], capture_output=True, text=True, env=env
    )
    if proc.returncode != 0:
        raise SystemExit(f"tools/layout.py {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout) if "--json" in args else {"stdout": proc.stdout}


def _predict(model: str, plan: Plan, gpu: str) -> dict[str, float]:
    flags = [f for f in plan.run_flags.split() if f not in ("--device", "cpu", "cuda")]
    layout = _layout([*shape_flags(model), *flags, "--gpus", "1", "--gpus-per-node", "1", "--gpu", gpu, "--json"])
    best = layout["layouts"][0]
    return {"step_time_s": best["step_time_s"], "memory_gb": best["memory"]["total_bytes"] / 2**30}


def device_profile(plan: Plan) -> str:
    """The calculator's profile for this device."""
    if plan.gpu is not None:
        return plan.gpu
    import torch

    name = torch.cuda.get_device_name()
    return "h200" if "H200" in name else "h100-sxm" if "H100" in name else "a100-80gb"


def calculator(plan: Plan, out: Path) -> dict[str, Any]:
    measured = json.loads((out / "throughput.json").read_text())["runs"]
    sdpa = {r["model"]: r for r in measured if r["attention"] == "sdpa"}
    gpu = device_profile(plan)
    rows = []
    for model, run in sdpa.items():
        predicted = _predict(model, plan, gpu)
        rows.append({"model": model, "profile": gpu, "measured_step_s": run["ms_per_iteration"] / 1e3,
                     "predicted_step_s": predicted["step_time_s"], "measured_memory_gb": run["peak_memory_gb"],
                     "predicted_memory_gb": predicted["memory_gb"]})  # fmt: skip
    # Calibrated on each size alone, predicting the other.
    for fitted, other in ((plan.models[0], plan.models[1]), (plan.models[1], plan.models[0])):
        profile = out / f"calibrated-on-{fitted}.json"
        _layout(["--calibrate", sdpa[fitted]["metrics_file"], "--profile-out", str(profile)])
        predicted = _predict(other, plan, str(profile))
        rows.append({"model": other, "profile": f"calibrated on {fitted}",
                     "measured_step_s": sdpa[other]["ms_per_iteration"] / 1e3,
                     "predicted_step_s": predicted["step_time_s"]})  # fmt: skip
    for row in rows:
        row["step_error"] = row["predicted_step_s"] / row["measured_step_s"] - 1
        if row.get("measured_memory_gb"):
            row["memory_error"] = row["predicted_memory_gb"] / row["measured_memory_gb"] - 1
    return {"rows": rows}


def _timed(fn: Callable[[], object], device: str, repeats: int = 10) -> float:
    """Median seconds of ``fn`` after two warm-up calls."""
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def kernels(plan: Plan, out: Path) -> dict[str, Any]:
    import torch

    from megatron_ext.estimate.hardware import get_profile
    from megatron_ext.estimate.kernels import attention_kernel_efficiency, gemm_shape_efficiency

    profile = get_profile(device_profile(plan))
    dtype = torch.bfloat16 if plan.device == "cuda" else torch.float32
    h = plan.gemm_hidden
    gemms = []
    for m in plan.gemm_tokens:
        # One MLP's GEMMs (h → 4h → h): forward, input gradient and weight gradient (reduction over m tokens).
        for name, (rows, cols, depth) in {"fc1 forward": (m, 4 * h, h), "fc2 forward": (m, h, 4 * h),
                                          "fc1 input grad": (m, h, 4 * h), "fc1 weight grad": (h, 4 * h, m),
                                          "fc2 weight grad": (4 * h, h, m)}.items():  # fmt: skip
            a = torch.randn(rows, depth, device=plan.device, dtype=dtype)
            b = torch.randn(depth, cols, device=plan.device, dtype=dtype)
            seconds = _timed(functools.partial(torch.matmul, a, b), plan.device)
            measured = 2 * rows * cols * depth / seconds
            model = (
                profile.peak_flops
                * profile.compute_efficiency
                * gemm_shape_efficiency(rows, cols, depth, sms=profile.sms, depth_half=profile.depth_half())
            )
            gemms.append({"gemm": name, "m": rows, "n": cols, "k": depth, "tokens": m,
                          "measured_tflops": measured / 1e12, "modelled_tflops": model / 1e12})  # fmt: skip
    attention = []
    heads, head_dim = max(h // 128, 1), min(h, 128)
    for s in plan.attention_lengths:
        batch = max(16384 // s, 1) if plan.device == "cuda" else 1
        q, k, v = (torch.randn(batch, heads, s, head_dim, device=plan.device, dtype=dtype, requires_grad=True)
                   for _ in range(3))  # fmt: skip

        def step(q: torch.Tensor = q, k: torch.Tensor = k, v: torch.Tensor = v) -> None:
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

        seconds = _timed(step, plan.device)
        flops = 3.5 * 4 * s * s * head_dim * heads * batch / 2  # the kernel count of estimate.kernels
        share = attention_kernel_efficiency(profile.attention_kernels, seq_length=s, head_dim=head_dim, backend="flash")
        attention.append({"seq_length": s, "batch": batch, "heads": heads, "head_dim": head_dim,
                          "measured_tflops": flops / seconds / 1e12,
                          "modelled_tflops": share * profile.peak_flops / 1e12})  # fmt: skip
    return {"profile": profile.name, "dtype": str(dtype), "gemms": gemms, "attention": attention}


def _pretrain(args: Sequence[str], *, log: Path, expect: int) -> None:
    env = child_env()
    with open(log, "w") as stream:
        code = subprocess.run(
            pretrain_command(args, nproc=1), stdout=stream, stderr=subprocess.STDOUT,
            env=env, cwd=REPO,
        ).returncode  # fmt: skip
    if code != expect:
        raise SystemExit(f"pretrain_gpt.py exited {code}, expected {expect}; see {log}:\n{log.read_text()[-3000:]}")


def _losses(metrics: Path) -> dict[int, float]:
    """The loss of each iteration of the run that continued (after a resume: the resumed run's)."""
    from megatron_ext.estimate.metrics_file import read_metrics_file

    return {r["iteration"]: r["lm_loss"] for r in read_metrics_file(metrics).rows if "lm_loss" in r}


def correctness(plan: Plan, out: Path) -> dict[str, Any]:
    import torch

    from megatron_ext.config.exit_codes import ExitCode
    from megatron_ext.huggingface.convert import export_to_hf
    from megatron_ext.inference.checkpoint import forward_logits, load_model, one_process, open_checkpoint

    work = out / "correctness"
    work.mkdir(exist_ok=True)
    run = [*plan.correctness_flags.split(), "--mock-data", "--train-iters", "6", "--lr", "1e-3", "--seed", "1234"]
    whole, parts, save = work / "whole.jsonl", work / "parts.jsonl", work / "checkpoint"
    _pretrain([*run, "--metrics-file", str(whole)], log=work / "whole.log", expect=0)
    resumable = [*run, "--save", str(save), "--metrics-file", str(parts)]
    _pretrain([*resumable, "--exit-interval", "3"], log=work / "stopped.log", expect=ExitCode.SAVED_AND_STOPPED)
    _pretrain([*resumable, "--load", str(save)], log=work / "resumed.log", expect=0)
    expected, got = _losses(whole), _losses(parts)
    different = [it for it in expected if got.get(it) != expected[it]]

    hf = work / "hf"
    export_to_hf(save, hf)
    tokens = torch.randint(0, 255, (2, 32), generator=torch.Generator().manual_seed(0))
    ckpt = open_checkpoint(save)
    with one_process(ckpt.cfg) as ctx:
        ours = forward_logits(load_model(ckpt, ctx.device), tokens.to(ctx.device)).float().cpu()
    import transformers

    dtype = torch.bfloat16 if "--bf16" in plan.correctness_flags.split() else torch.float32
    theirs_model: Any = transformers.AutoModelForCausalLM.from_pretrained(str(hf), local_files_only=True, dtype=dtype)
    with torch.no_grad():
        theirs = theirs_model.to(plan.device).eval()(tokens.to(plan.device)).logits.float().cpu()
    vocab = theirs.shape[-1]
    difference = float((theirs - ours[..., :vocab]).abs().max())
    return {
        "resume_bit_exact": not different and sorted(got) == sorted(expected),
        "iterations_differing": different,
        "losses_whole": expected,
        "losses_resumed": got,
        "hf_dtype": str(dtype),
        "hf_max_abs_logit_difference": difference,
        "hf_relative_difference": difference / float(ours.abs().max()),
    }


STEP_FUNCTIONS: dict[str, Callable[[Plan, Path], dict[str, Any]]] = {
    "throughput": throughput,
    "calculator": calculator,
    "kernels": kernels,
    "correctness": correctness,
}

# ------------------------------------------------------------------------------------------ the summary


def _pct(value: float | None) -> str:
    return "" if value is None else f"{value:+.1%}"


def _num(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
        "| " + " | ".join(r) + " |" for r in rows
    ]


def summary_markdown(results: dict[str, Any], statuses: dict[str, dict[str, Any]]) -> str:
    """Every step's status, then the figures of those that finished, as Markdown tables."""
    lines = _table(
        ["step", "status", "seconds"], [[k, s["status"], f"{s['seconds']:.0f}"] for k, s in statuses.items()]
    )
    if "throughput" in results:
        header = ["run", "tokens/s", "TFLOP/s", "MFU", "peak allocated GiB", "peak reserved GiB"]
        lines += _table(header, [[r["variant"], f"{r['tokens_per_sec']:,.0f}", f"{r['tflops_per_gpu']:.1f}",
                                  _num(r["mfu"], ".1%"), _num(r["peak_memory_gb"], ".1f"),
                                  _num(r["peak_reserved_gb"], ".1f")] for r in results["throughput"]["runs"]])  # fmt: skip
    if "calculator" in results:
        header = ["model", "profile", "measured s", "predicted s", "step error", "memory error"]
        lines += _table(header, [[r["model"], r["profile"], f"{r['measured_step_s']:.3f}", f"{r['predicted_step_s']:.3f}",
                                  _pct(r["step_error"]), _pct(r.get("memory_error"))]
                                 for r in results["calculator"]["rows"]])  # fmt: skip
    if "kernels" in results:
        k = results["kernels"]
        rows = [[g["gemm"], f"{g['m']}×{g['n']}×{g['k']}", f"{g['measured_tflops']:.1f}", f"{g['modelled_tflops']:.1f}"]
                for g in k["gemms"]]  # fmt: skip
        rows += [["SDPA causal forward + backward", f"s={a['seq_length']}", f"{a['measured_tflops']:.1f}",
                  f"{a['modelled_tflops']:.1f}"] for a in k["attention"]]  # fmt: skip
        lines += _table(["kernel", "shape (m×n×k)", "measured TFLOP/s", f"modelled ({k['profile']})"], rows)
    if "correctness" in results:
        c = results["correctness"]
        lines += ["", f"- Resumed bit for bit: {c['resume_bit_exact']}.",
                  f"- Hugging Face export ({c['hf_dtype']}): logits within {c['hf_max_abs_logit_difference']:.3g} of "
                  f"Megatron-Core's ({c['hf_relative_difference']:.2g} of the largest)."]  # fmt: skip
    return "\n".join(lines[1:]) + "\n"


def run_steps(plan_name: str, out: Path, steps: Sequence[str], budgets: dict[str, float]) -> dict[str, dict[str, Any]]:
    """Each step in a process of its own, within its budget; {step: {status, seconds}}."""
    plan = CPU_REHEARSAL if plan_name == "cpu-rehearsal" else GPU_PLAN
    budget_s = {**plan.budget_s, **budgets}
    statuses: dict[str, dict[str, Any]] = {}
    for step in steps:
        (out / f"{step}.json").unlink(missing_ok=True)
        command = [sys.executable, __file__, "--out", str(out), "--step", step]
        command += ["--cpu-rehearsal"] if plan_name == "cpu-rehearsal" else []
        start = time.monotonic()
        with open(out / f"{step}.log", "w") as log:
            # A group of its own: a step past its budget is ended with the ranks it started.
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                code = proc.wait(timeout=budget_s[step])
                status = "ok" if code == 0 and (out / f"{step}.json").exists() else f"failed (exit {code})"
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                status = f"stopped at its budget of {budget_s[step]:g} s"
        statuses[step] = {"status": status, "seconds": time.monotonic() - start}
        print(f"gpu check: {step}: {status} ({statuses[step]['seconds']:.0f} s)", flush=True)
    return statuses


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--out", type=Path, required=True, help="Folder for every figure (JSON) and summary.md.")
    parser.add_argument("--cpu-rehearsal", action="store_true", help="Tiny shapes on CPU processes (the tests).")
    parser.add_argument("--step", choices=STEPS, action="append", help="Run these steps only (default: all).")
    parser.add_argument(
        "--budget", action="append", default=[], metavar="STEP=SECONDS", help="Another time limit for a step."
    )
    args = parser.parse_args(argv)
    budgets = {}
    for given in args.budget:
        step, _, seconds = given.partition("=")
        if step not in STEPS or not seconds.replace(".", "", 1).isdigit():
            parser.error(f"--budget {given}: give STEP=SECONDS, STEP one of {', '.join(STEPS)}")
        budgets[step] = float(seconds)
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1" if args.cpu_rehearsal else "8")
    plan_name = "cpu-rehearsal" if args.cpu_rehearsal else "gpu"
    steps = args.step or list(STEPS)
    if len(steps) == 1 and os.environ.get("GPU_CHECK_IN_STEP") == "1":
        plan = CPU_REHEARSAL if args.cpu_rehearsal else GPU_PLAN
        result = STEP_FUNCTIONS[steps[0]](plan, args.out)
        (args.out / f"{steps[0]}.json").write_text(json.dumps(result, indent=1) + "\n")
        return 0
    os.environ["GPU_CHECK_IN_STEP"] = "1"
    statuses = run_steps(plan_name, args.out, steps, budgets)
    results = {s: json.loads((args.out / f"{s}.json").read_text()) for s in steps if statuses[s]["status"] == "ok"}
    (args.out / "summary.json").write_text(json.dumps({"plan": plan_name, "steps": statuses}, indent=1) + "\n")
    (args.out / "summary.md").write_text(summary_markdown(results, statuses))
    print((args.out / "summary.md").read_text())
    return 0 if all(s["status"] == "ok" for s in statuses.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
