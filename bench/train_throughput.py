#!/usr/bin/env python3
"""Training throughput of a named model and layout: tokens/s, TFLOP/s, MFU, where the time goes.

Runs ``pretrain_gpt.py`` (through ``megatron_ext.cli.launch``) for warm-up plus
measured iterations on mock data, with Megatron-Core's timers on, and reports
over the measured iterations only:

* tokens/s, model TFLOP/s per GPU (Megatron-LM's formula) and MFU against
  the GPU's dense bf16 peak (GPU only), peak memory (GPU only);
* milliseconds per iteration in forward compute, backward compute, the
  optimizer, blocking pipeline send/receive, and the rest of the schedule
  (maximum over ranks, Megatron-Core's timer names);
* the measured pipeline bubble next to ``(p-1)/(v*m)``.

Variants run one after the other in the same invocation, alternating over
``--repeats`` rounds, so that they are compared side by side on the same
machine state::

    # GPU: SDPA core attention vs Megatron-Core's own local attention, 1.3B, bf16
    python bench/train_throughput.py --model gpt3-1.3b --nproc 1 --iters 20 --warmup 5 \\
        --variant sdpa=--attention-backend=auto --variant mcore-local=--attention-backend=local \\
        -- --bf16 --micro-batch-size 4 --global-batch-size 32 --transformer-impl local

    # CPU rehearsal of the same measurement (tiny model, two pipeline stages)
    python bench/train_throughput.py --model tiny --device cpu --nproc 2 --iters 4 --warmup 1 \\
        -- --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1

Everything after ``--`` goes to ``pretrain_gpt.py`` unchanged. Timers at
level 2 synchronise the GPU around every microbatch's compute; pass
``--timing-log-level 1`` for the headline tokens/s without that cost (the
breakdown then has the step-level timers only).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from megatron_ext.cli.launch import local_command
from megatron_ext.config.presets import PRESETS
from megatron_ext.estimate.metrics_file import read_metrics_file
from megatron_ext.training.timing import COMPUTE_TIMERS

REPO = Path(__file__).resolve().parent.parent

TINY = {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 64, "vocab_size": 1023}
"""A CPU-sized GPT so that the benchmark itself is exercised by the tests."""


@dataclass
class Result:
    """One variant's figures over the measured iterations (medians over iterations and repeats)."""

    variant: str
    pretrain_args: list[str]
    iterations: int
    tokens_per_sec: float
    tflops_per_gpu: float
    ms_per_iteration: float
    mfu: float | None
    peak_memory_gb: float | None
    time_ms: dict[str, float] = field(default_factory=dict)
    """Per-iteration milliseconds by timer (max over ranks); 'other' is the schedule minus compute and p2p."""
    bubble_measured: float | None = None
    bubble_predicted: float | None = None


def child_env(**extra: str) -> dict[str, str]:
    """This environment with the repository first on ``PYTHONPATH`` (keeping what was there: the GPU check's
    wheels), and ``extra``."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path, **extra)


def model_flags(name: str) -> list[str]:
    """``pretrain_gpt.py`` shape flags of a preset (or of the CPU-sized ``tiny``)."""
    if name == "tiny":
        shape: dict[str, Any] = dict(TINY)
    elif name in PRESETS:
        shape = PRESETS[name].model_flags()
    else:
        raise SystemExit(f"unknown --model {name!r}; choose tiny or one of {', '.join(PRESETS)}")
    return [part for key, value in shape.items() for part in (f"--{key.replace('_', '-')}", str(value))]


LAUNCHER_VARIABLE = "BENCH_PRETRAIN_LAUNCHER"
"""A command that starts ``pretrain_gpt.py``'s processes in place of the ones ``pretrain_command`` names, given
``--nproc N SCRIPT ARGS``: the test suite's forks them from a process that has imported torch and Megatron-Core
(``tests/rank_client.py``), as it does its own runs'."""


def pretrain_command(args: Sequence[str], *, nproc: int) -> list[str]:
    """``pretrain_gpt.py args`` on ``nproc`` processes of this machine: one runs as a plain process (a world of
    one needs no launcher, whose own interpreter would cost as much as the run's start), more under ours; with
    ``BENCH_PRETRAIN_LAUNCHER`` set, under that command."""
    if launcher := os.environ.get(LAUNCHER_VARIABLE):
        return [*shlex.split(launcher), "--nproc", str(nproc), str(REPO / "pretrain_gpt.py"), *args]
    if nproc == 1:
        return [sys.executable, str(REPO / "pretrain_gpt.py"), *args]
    return local_command(REPO / "pretrain_gpt.py", list(args), nproc=nproc)


def run_variant(
    *, name: str, args: list[str], nproc: int, iters: int, warmup: int, timing_level: int, workdir: Path
) -> list[dict[str, Any]]:
    """Train ``warmup + iters`` iterations; the per-iteration metrics records after warm-up."""
    metrics = workdir / f"{name}.jsonl"
    metrics.unlink(missing_ok=True)
    log = workdir / f"{name}.log"
    cmd = pretrain_command(
        [
            *args,
            "--mock-data",
            "--train-iters",
            str(warmup + iters),
            "--log-interval",
            "1",
            "--timing-log-level",
            str(timing_level),
            "--metrics-file",
            str(metrics),
        ],
        nproc=nproc,
    )
    env = child_env()
    with open(log, "w") as out:
        code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO).returncode
    if code != 0:
        tail = log.read_text()[-4000:]
        raise SystemExit(f"variant {name!r} failed (exit code {code}):\n{' '.join(cmd)}\n{tail}")
    return [r for r in read_metrics_file(metrics).rows if "lm_loss" in r and r["iteration"] > warmup]


def summarise(name: str, args: list[str], rows: list[dict[str, Any]]) -> Result:
    def median(key: str) -> float | None:
        values = [r[key] for r in rows if r.get(key) is not None]
        return statistics.median(values) if values else None

    times: dict[str, float] = {}
    for key in rows[0].get("time_ms", {}):
        times[key] = statistics.median(r["time_ms"].get(key, 0.0) for r in rows)
    if "forward-backward" in times and all(k in times for k in COMPUTE_TIMERS):
        schedule = times["forward-backward"] - times.get("all-grads-sync", 0.0)
        busy = sum(times[k] for k in COMPUTE_TIMERS) + times.get("p2p-wait", 0.0)
        times["other"] = max(schedule - busy, 0.0)
    return Result(
        variant=name,
        pretrain_args=args,
        iterations=len(rows),
        tokens_per_sec=median("tokens_per_sec") or 0.0,
        tflops_per_gpu=median("tflops_per_gpu") or 0.0,
        ms_per_iteration=median("elapsed_ms") or 0.0,
        mfu=median("mfu"),
        peak_memory_gb=max((r["peak_memory_gb"] for r in rows if "peak_memory_gb" in r), default=None),
        time_ms=times,
        bubble_measured=median("bubble_measured_mean"),
        bubble_predicted=median("bubble_predicted"),
    )


def table(results: Sequence[Result]) -> str:
    cols = ["variant", "tokens/s", "TFLOP/s/GPU", "MFU", "peak GiB", "ms/it", "fwd", "bwd", "optim", "p2p", "bubble"]
    lines = [cols]
    for r in results:
        t = r.time_ms
        bubble = (
            f"{r.bubble_measured:.3f} (pred {r.bubble_predicted:.3f})"
            if r.bubble_measured is not None and r.bubble_predicted is not None
            else "-"
        )
        lines.append(
            [
                r.variant,
                f"{r.tokens_per_sec:,.0f}",
                f"{r.tflops_per_gpu:.2f}",
                f"{r.mfu:.1%}" if r.mfu is not None else "-",
                f"{r.peak_memory_gb:.1f}" if r.peak_memory_gb is not None else "-",
                f"{r.ms_per_iteration:.1f}",
                *(f"{t[k]:.1f}" if k in t else "-" for k in ("forward-compute", "backward-compute", "optimizer")),
                f"{t['p2p-wait']:.1f}" if "p2p-wait" in t else "-",
                bubble,
            ]
        )
    widths = [max(len(row[i]) for row in lines) for i in range(len(cols))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in lines)


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    argv = list(argv)
    passthrough: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, passthrough = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--model", default="tiny", help=f"tiny (CPU) or one of: {', '.join(PRESETS)}")
    parser.add_argument("--nproc", type=int, default=1, help="Processes (GPUs) on this machine.")
    parser.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    parser.add_argument("--iters", type=int, default=10, help="Measured iterations per run.")
    parser.add_argument("--warmup", type=int, default=3, help="Iterations before measuring (compilation, caches).")
    parser.add_argument("--repeats", type=int, default=1, help="Rounds over all variants, alternating.")
    parser.add_argument("--timing-log-level", type=int, default=2, choices=[1, 2])
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=FLAGS",
        help="A named variant: extra pretrain_gpt.py flags, comma- or space-separated "
        "(e.g. mcore-local=--attention-backend=local). Default: one variant with no extra flags.",
    )
    parser.add_argument("--json", type=Path, help="Also write the results as JSON here.")
    args = parser.parse_args(argv)
    if args.iters < 1 or args.warmup < 0 or args.repeats < 1:
        parser.error("--iters and --repeats must be >= 1 and --warmup >= 0")
    return args, passthrough


def variant_flags(spec: str) -> tuple[str, list[str]]:
    name, sep, flags = spec.partition("=")
    if not sep or not name:
        raise SystemExit(f"--variant {spec!r}: expected NAME=FLAGS, e.g. local=--attention-backend=local")
    parts = [p for chunk in flags.replace(",", " ").split() for p in chunk.split("=", 1)] if flags else []
    return name, parts


def main(argv: Sequence[str] | None = None) -> int:
    args, passthrough = parse(sys.argv[1:] if argv is None else argv)
    variants = [variant_flags(v) for v in args.variant] or [("default", [])]
    base = [*model_flags(args.model), "--device", args.device, *passthrough]
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in variants}
    with tempfile.TemporaryDirectory(prefix="bench-throughput-") as tmp:
        for _ in range(args.repeats):
            for name, flags in variants:
                rows[name] += run_variant(
                    name=name,
                    args=[*base, *flags],
                    nproc=args.nproc,
                    iters=args.iters,
                    warmup=args.warmup,
                    timing_level=args.timing_log_level,
                    workdir=Path(tmp),
                )
    results = [summarise(name, [*base, *flags], rows[name]) for name, flags in variants]
    print(f"model {args.model}, {args.nproc} process(es), {args.iters} measured iterations × {args.repeats} round(s)")
    print(table(results))
    if len(results) > 1 and results[-1].tokens_per_sec > 0:
        ref = results[-1]
        for r in results[:-1]:
            print(f"{r.variant} / {ref.variant}: {r.tokens_per_sec / ref.tokens_per_sec:.2f}× tokens/s")
    if args.json:
        args.json.write_text(json.dumps({"results": [asdict(r) for r in results]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
