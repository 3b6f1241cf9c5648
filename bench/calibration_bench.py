#!/usr/bin/env python3
"""Calibrate a profile from two measured layouts, then predict three others and measure them.

The end-to-end check of ``tools/layout.py --calibrate`` on this machine's CPU processes (gloo): one model,
five layouts, each trained for a few iterations with ``--timing-log-level 2`` and its ``--metrics-file``:

* calibration: TP2, and DP2 with the distributed optimizer (``--calibrate`` fits the profile to both);
* prediction: PP2 (1F1B), PP2 × VP2 (interleaved 1F1B) and DP2 without the distributed optimizer, each
  predicted by ``tools/layout.py --gpu PROFILE.json`` and compared with its measurement; and, reported apart,
  DP2 at micro-batch 2, which two runs at micro-batch 1 do not calibrate.

Every layout runs two processes of one thread (``OMP_NUM_THREADS=1``) on the 2-core machine: a process
alone on it runs faster than two side by side, which no profile of one device describes. Rounds alternate over the layouts (``--repeats``); each round
calibrates on its own two runs and predicts its own three, and the table gives the median error over rounds::

    python bench/calibration_bench.py --repeats 3 --json /tmp/calibration.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from train_throughput import REPO, run_variant  # bench/ is sys.path[0] when this runs as a script

MODEL = [
    "--num-layers",
    "4",
    "--hidden-size",
    "256",
    "--num-attention-heads",
    "4",
    "--seq-length",
    "128",
    "--max-position-embeddings",
    "128",
    "--micro-batch-size",
    "1",
    "--global-batch-size",
    "8",
    "--device",
    "cpu",
]
"""A model whose layers' GEMMs, not the framework's overhead, take most of a CPU core's step."""

CALIBRATION = {
    "tp2": (2, ["--tensor-model-parallel-size", "2"]),
    "dp2-distopt": (2, ["--use-distributed-optimizer"]),
}
PREDICTED = {
    "pp2": (2, ["--pipeline-model-parallel-size", "2"]),
    "pp2-vp2": (2, ["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"]),
    "dp2": (2, []),
}
BEYOND = {"dp2-mbs2": (2, ["--micro-batch-size", "2"])}
"""Predicted too, but outside what two runs at micro-batch 1 calibrate: a layer pass's fixed overhead and the
GEMMs' rate cannot be told apart at one micro-batch size (``calibration.FITTED``)."""
"""Layout name: (processes, pretrain_gpt.py flags)."""


def measured_step_s(rows: list[dict[str, Any]]) -> float:
    """The median iteration time of a run's measured (post-warm-up) records, seconds."""
    return statistics.median(r["elapsed_ms"] for r in rows) / 1000


def layout_py(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, str(REPO / "tools" / "layout.py"), *args], capture_output=True, text=True, env=env
    )


def predicted_step_s(profile: Path, flags: Sequence[str], processes: int) -> float:
    """``tools/layout.py``'s estimate of the layout on the calibrated profile (evaluate mode), seconds."""
    model = [f for f in MODEL if f not in ("--device", "cpu")] + ["--vocab-size", "1024"]
    proc = layout_py(
        [
            *model,
            *flags,
            "--tensor-model-parallel-size",
            _factor(flags, "--tensor-model-parallel-size"),
            "--gpus",
            str(processes),
            "--gpus-per-node",
            str(processes),
            "--gpu",
            str(profile),
            "--json",
        ]
    )
    if proc.returncode != 0:
        raise SystemExit(f"tools/layout.py failed ({proc.returncode}):\n{proc.stderr}")
    return float(json.loads(proc.stdout)["layouts"][0]["step_time_s"])


def _factor(flags: Sequence[str], name: str) -> str:
    return flags[flags.index(name) + 1] if name in flags else "1"


def one_round(workdir: Path, *, iters: int, warmup: int, beyond: bool) -> dict[str, dict[str, float]]:
    """Measure the layouts, calibrate on two, predict the others: {layout: {measured_s, predicted_s}}."""
    measured: dict[str, float] = {}
    predicted = {**PREDICTED, **(BEYOND if beyond else {})}
    for name, (processes, flags) in {**CALIBRATION, **predicted}.items():
        rows = run_variant(
            name=name,
            args=[*MODEL, *flags],
            nproc=processes,
            iters=iters,
            warmup=warmup,
            timing_level=2,
            workdir=workdir,
        )
        measured[name] = measured_step_s(rows)
    profile = workdir / "calibrated.json"
    profile.unlink(missing_ok=True)
    proc = layout_py(
        ["--calibrate", *(str(workdir / f"{name}.jsonl") for name in CALIBRATION), "--profile-out", str(profile)]
    )
    if proc.returncode != 0:
        raise SystemExit(f"--calibrate failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    print(proc.stdout)
    return {
        name: {"measured_s": measured[name], "predicted_s": predicted_step_s(profile, flags, processes)}
        for name, (processes, flags) in predicted.items()
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--repeats", type=int, default=3, help="Rounds (each calibrates and predicts anew).")
    parser.add_argument("--iters", type=int, default=6, help="Measured iterations per run.")
    parser.add_argument("--warmup", type=int, default=3, help="Iterations before measuring.")
    parser.add_argument("--json", type=Path, help="Also write the results as JSON here.")
    parser.add_argument("--skip-beyond", action="store_true", help="Measure and predict the calibrated range only.")
    parser.add_argument("--keep", type=Path, help="Keep each round's metrics files and profile under this folder.")
    args = parser.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"
    rounds = []
    with tempfile.TemporaryDirectory(prefix="bench-calibration-") as tmp:
        for i in range(args.repeats):
            workdir = (args.keep / f"round{i + 1}") if args.keep else Path(tmp)
            workdir.mkdir(parents=True, exist_ok=True)
            rounds.append(one_round(workdir, iters=args.iters, warmup=args.warmup, beyond=not args.skip_beyond))
    shown = [*PREDICTED, *([] if args.skip_beyond else BEYOND)]
    errors = {name: [r[name]["predicted_s"] / r[name]["measured_s"] - 1 for r in rounds] for name in shown}
    print(f"calibrated on {', '.join(CALIBRATION)}; {args.repeats} round(s) of {args.iters} measured iterations")
    print(f"{'layout':<12}  {'measured ms':>11}  {'predicted ms':>12}  {'median error':>12}")
    for name in shown:
        if name in BEYOND:
            print("beyond the calibration (another micro-batch size):")
        measured = statistics.median(r[name]["measured_s"] for r in rounds) * 1e3
        predicted = statistics.median(r[name]["predicted_s"] for r in rounds) * 1e3
        print(f"{name:<12}  {measured:>11.1f}  {predicted:>12.1f}  {statistics.median(errors[name]):>+12.1%}")
    if args.json:
        args.json.write_text(
            json.dumps({"rounds": rounds, "median_error": {k: statistics.median(v) for k, v in errors.items()}})
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
