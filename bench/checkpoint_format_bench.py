#!/usr/bin/env python3
"""Save time and size on disk of the distributed optimizer's two checkpoint formats, side by side.

Megatron-LM's default format (``dp_reshardable``) has each rank write its own flat shard of the
optimizer state in parallel; it loads under another DP only. ``--dist-ckpt-optim-fully-reshardable``
(``fully_reshardable``) saves the state per parameter, gathered over the data-parallel ranks at every
save; it loads under any TP, PP, VP and DP. Each round trains a GPT with the distributed optimizer on
``--nproc`` CPU processes (gloo, DP = nproc, mock data) for ``--iters`` iterations, saving after every
one (``--save-interval 1``), once per format, the order alternating from round to round, each run in
a fresh directory. Per save it records:

* the time of ``checkpointing.save_checkpoint`` (the whole synchronous save: sharded state dicts,
  Megatron-Core's ``dist_checkpointing.save``, the CRC-32 manifest, the tracker), the maximum over
  ranks, and of it the time spent building the optimizer's sharded state dict
  (``DistributedOptimizer.sharded_state_dict``: for ``fully_reshardable`` the gather over DP) and
  hashing the files (``_write_checksums``). The training loop logs no duration, so each rank runs
  ``pretrain_gpt.py`` through this script, which wraps those three functions with a timer and
  changes nothing else. A process's first save also pays one-time set-up, so the table gives it
  apart from the later saves (the steady state);
* the size on disk of the iteration directory, the optimizer's share and what the busiest rank wrote
  (from the stored items' lengths and files in the ``.metadata`` of ``torch.distributed.checkpoint``),
  and the number of files.

Then it resumes the last round's checkpoint of each format under PP ``--nproc`` (DP 1): the fully
reshardable one trains on, the per-rank one is refused. Everything is written under a temporary
directory removed at the end. The figures in docs/performance.md come from::

    python bench/checkpoint_format_bench.py --rounds 3

Everything after ``--`` goes to every ``pretrain_gpt.py`` run unchanged (e.g. ``-- --bf16``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import re
import runpy
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from train_throughput import child_env  # bench/ is sys.path[0]

from megatron_ext.cli.launch import local_command

REPO = Path(__file__).resolve().parent.parent

PRETRAIN = REPO / "pretrain_gpt.py"
WORKER = "--worker"
"""First argument of this script when torchrun starts it as one rank of ``pretrain_gpt.py``."""

FORMATS = {
    "per rank (dp_reshardable)": [],
    "fully reshardable": ["--dist-ckpt-optim-fully-reshardable"],
}


@dataclass
class Save:
    """One checkpoint: its save time (max over ranks) and what it left on disk."""

    iteration: int
    seconds: float
    checksum_seconds: float
    optimizer_state_seconds: float
    """``DistributedOptimizer.sharded_state_dict`` (fully_reshardable: the gather over DP)."""
    bytes: int
    optimizer_bytes: int
    busiest_rank_bytes: int
    """Written by the rank that wrote the most (DP rank 0: replicated tensors are its to write)."""
    files: int


@dataclass
class Outcome:
    """A resume of a format's checkpoint under another layout."""

    exit_code: int
    message: str


@dataclass
class Results:
    saves: dict[str, list[Save]] = field(default_factory=lambda: {name: [] for name in FORMATS})
    loads: dict[str, Outcome] = field(default_factory=dict)
    parameters: str = "?"


# ------------------------------------------------------------------ worker side (one rank under torchrun)
def _timed(func: Callable[..., Any], key: str, out: Path, *, saving: bool = False) -> Callable[..., Any]:
    """``func`` appending its duration to ``out`` (with ``saving``: only calls without ``is_loading=True``)."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = func(*args, **kwargs)
        if not (saving and kwargs.get("is_loading")):
            with open(out, "a") as f:
                f.write(json.dumps({"what": key, "seconds": time.perf_counter() - start}) + "\n")
        return result

    return wrapper


def worker(times_dir: str, pretrain_args: list[str]) -> None:
    """Run ``pretrain_gpt.py`` in this process with the save and two of its parts timed."""
    from megatron_ext.training import checkpointing  # first: it sets up Megatron-Core's import on CPU

    distrib_optimizer = importlib.import_module("megatron.core.optimizer.distrib_optimizer")
    optimizer_class = distrib_optimizer.DistributedOptimizer
    out = Path(times_dir) / f"rank{os.environ.get('RANK', '0')}.jsonl"
    # The loop calls checkpointing.save_checkpoint, which calls _write_checksums (both by module attribute).
    checkpointing.save_checkpoint = _timed(checkpointing.save_checkpoint, "save", out)
    checkpointing._write_checksums = _timed(checkpointing._write_checksums, "checksums", out)
    # The optimizer's sharded state dict: for fully_reshardable, the gather over DP and the unflattening.
    optimizer_class.sharded_state_dict = _timed(optimizer_class.sharded_state_dict, "optimizer_state", out, saving=True)
    sys.argv = [str(PRETRAIN), *pretrain_args]
    runpy.run_path(str(PRETRAIN), run_name="__main__")


# ------------------------------------------------------------------ bench side
def model_flags(args: argparse.Namespace) -> list[str]:
    return [
        *("--num-layers", str(args.num_layers), "--hidden-size", str(args.hidden_size)),
        *("--num-attention-heads", str(args.heads), "--seq-length", str(args.seq_length)),
        *("--vocab-size", str(args.vocab_size), "--micro-batch-size", "1", "--global-batch-size", str(args.nproc)),
        # A schedule that does not depend on --train-iters, so that a resume may train further.
        *("--lr", "1e-4", "--lr-decay-iters", "100", "--seed", "1234"),
        *("--mock-data", "--device", "cpu", "--use-distributed-optimizer", "--log-interval", "1"),
    ]


def run(args: list[str], *, nproc: int, log: Path, times_dir: Path | None = None) -> int:
    """``pretrain_gpt.py`` on ``nproc`` CPU processes (through this script's timing worker with ``times_dir``)."""
    if times_dir is not None:
        times_dir.mkdir(parents=True)
        cmd = local_command(Path(__file__).resolve(), [WORKER, str(times_dir), *args], nproc=nproc)
    else:
        cmd = local_command(PRETRAIN, args, nproc=nproc)
    env = child_env(OMP_NUM_THREADS="1")
    with open(log, "w") as out:
        return subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO).returncode


def stored_bytes(path: Path) -> tuple[int, int]:
    """The optimizer's bytes (items under ``optimizer.``) and the most bytes one rank wrote (its
    ``__RANK_*.distcp`` files), from the ``.metadata`` of torch.distributed.checkpoint."""
    from torch.distributed.checkpoint import FileSystemReader

    metadata = FileSystemReader(str(path)).read_metadata()
    optimizer = 0
    by_rank: dict[str, int] = {}
    for index, info in metadata.storage_data.items():
        if index.fqn.startswith("optimizer."):
            optimizer += info.length
        rank = info.relative_path.split("_")[2]  # __RANK_WRITER.distcp
        by_rank[rank] = by_rank.get(rank, 0) + info.length
    return optimizer, max(by_rank.values())


def on_disk(path: Path) -> tuple[int, int]:
    files = [f for f in path.rglob("*") if f.is_file()]
    return sum(f.stat().st_size for f in files), len(files)


def saves_of(save_dir: Path, times_dir: Path) -> list[Save]:
    """The run's saves in order: the slowest rank's times beside each directory's size."""
    per_rank: list[list[dict[str, float]]] = []
    for file in sorted(times_dir.glob("rank*.jsonl")):
        closed: list[dict[str, float]] = []
        parts: dict[str, float] = {}
        for line in file.read_text().splitlines():
            record = json.loads(line)
            parts[record["what"]] = parts.get(record["what"], 0.0) + record["seconds"]
            if record["what"] == "save":  # the parts are timed inside the save: it closes them
                closed.append(parts)
                parts = {}
        per_rank.append(closed)

    def slowest(what: str) -> list[float]:
        return [max(save.get(what, math.nan) for save in one) for one in zip(*per_rank, strict=True)]

    seconds, checksums, optimizer_state = slowest("save"), slowest("checksums"), slowest("optimizer_state")
    dirs = sorted(save_dir.glob("iter_*"))
    if len(dirs) != len(seconds):
        raise SystemExit(f"{save_dir}: {len(dirs)} checkpoint directories but {len(seconds)} timed saves")
    saves = []
    for path, secs, crc, state in zip(dirs, seconds, checksums, optimizer_state, strict=True):
        size, files = on_disk(path)
        optimizer, busiest = stored_bytes(path)
        saves.append(Save(int(path.name.removeprefix("iter_")), secs, crc, state, size, optimizer, busiest, files))
    return saves


def load_outcome(code: int, log: Path) -> Outcome:
    text = log.read_text()
    if code == 0:
        loaded = re.search(r"loaded checkpoint \S+ \(iteration (\d+)\)", text)
        done = re.search(r"done: (\d+) iterations", text)
        what = f"loaded iteration {loaded.group(1)}" if loaded else "no 'loaded checkpoint' line"
        return Outcome(code, f"{what}, trained to iteration {done.group(1) if done else '?'}")
    error = re.search(r"rank 0\] checkpoint error: (.*)", text) or re.search(r"checkpoint error: (.*)", text)
    if error:
        return Outcome(code, error.group(1).strip())
    lines = [line for line in text.splitlines() if line.strip()]
    return Outcome(code, lines[-1] if lines else "(no output)")


def fmt_range(values: Sequence[float]) -> str:
    return f"{min(values):.2f}–{max(values):.2f}"


def mib(n: float) -> str:
    return f"{n / 2**20:,.1f}"


def table(results: Results, *, pp: int) -> str:
    cols = ["format", "first save s", "later saves", "median s", "min–max s", "optim. state s", "CRC s", "MiB"]
    cols += ["optimizer MiB", "busiest rank MiB", "files", f"loads under PP {pp}"]
    lines = [cols]
    for name, saves in results.saves.items():
        first = [s.seconds for s in saves if s.iteration == 1]
        later = [s for s in saves if s.iteration > 1]
        seconds = [s.seconds for s in later]
        sizes = sorted({s.bytes for s in saves})
        outcome = results.loads.get(name)
        lines.append(
            [
                name,
                f"{statistics.median(first):.2f}" if first else "-",
                str(len(later)),
                f"{statistics.median(seconds):.2f}" if seconds else "-",
                fmt_range(seconds) if seconds else "-",
                f"{statistics.median(s.optimizer_state_seconds for s in later):.2f}" if later else "-",
                f"{statistics.median(s.checksum_seconds for s in later):.2f}" if later else "-",
                mib(sizes[0]) if len(sizes) == 1 else f"{mib(sizes[0])}–{mib(sizes[-1])}",
                mib(statistics.median(s.optimizer_bytes for s in saves)),
                mib(statistics.median(s.busiest_rank_bytes for s in saves)),
                "/".join(str(n) for n in sorted({s.files for s in saves})),
                "-"
                if outcome is None
                else ("loads" if outcome.exit_code == 0 else "refused") + f" (exit {outcome.exit_code})",
            ]
        )
    widths = [max(len(row[i]) for row in lines) for i in range(len(cols))]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in lines
    )


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    argv = list(argv)
    passthrough: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, passthrough = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="Rounds over both formats, alternating the order.")
    parser.add_argument("--iters", type=int, default=3, help="Training iterations per run, each followed by a save.")
    parser.add_argument("--nproc", type=int, default=2, help="CPU processes: DP for the saves, PP for the resume.")
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--hidden-size", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--seq-length", type=int, default=256)
    parser.add_argument("--vocab-size", type=int, default=16384)
    parser.add_argument("--keep", type=Path, help="Copy the logs and timings here before the temporary directory goes.")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.iters < 1 or args.nproc < 2:
        parser.error("--rounds and --iters must be >= 1, --nproc >= 2")
    if args.num_layers % args.nproc:
        parser.error("--num-layers must divide into --nproc pipeline stages for the resume")
    return args, passthrough


def main(argv: Sequence[str] | None = None) -> int:
    args, passthrough = parse(sys.argv[1:] if argv is None else argv)
    base = [*model_flags(args), *passthrough]
    results = Results()
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-format-") as tmp_name:
        tmp = Path(tmp_name)
        last: dict[str, Path] = {}
        for round_ in range(args.rounds):
            order = list(FORMATS) if round_ % 2 == 0 else list(reversed(FORMATS))
            for name in order:
                workdir = tmp / f"round{round_}-{'full' if FORMATS[name] else 'per-rank'}"
                workdir.mkdir()
                save_dir = workdir / "ckpt"
                flags = [*base, *FORMATS[name], "--train-iters", str(args.iters), "--save-interval", "1"]
                log = workdir / "train.log"
                code = run([*flags, "--save", str(save_dir)], nproc=args.nproc, log=log, times_dir=workdir / "times")
                if code != 0:
                    tail = log.read_text()[-4000:]
                    raise SystemExit(f"{name}, round {round_ + 1}: exit code {code}\n{tail}")
                if round_ == 0 and name == order[0]:
                    found = re.search(r"parameters: ([\d,]+) in total", log.read_text())
                    results.parameters = found.group(1) if found else "?"
                results.saves[name] += saves_of(save_dir, workdir / "times")
                if last.get(name):
                    shutil.rmtree(last[name])  # keep the disk small: only the last round's checkpoints
                last[name] = save_dir
        for name, save_dir in last.items():
            log = save_dir.parent / f"resume-pp{args.nproc}.log"
            resume = [*base, *FORMATS[name], "--train-iters", str(args.iters + 1), "--load", str(save_dir)]
            code = run([*resume, "--pipeline-model-parallel-size", str(args.nproc)], nproc=args.nproc, log=log)
            results.loads[name] = load_outcome(code, log)
        if args.keep:
            shutil.copytree(tmp, args.keep, dirs_exist_ok=True, ignore=shutil.ignore_patterns("ckpt"))
    shape = f"{args.num_layers} layers, hidden {args.hidden_size}, vocabulary {args.vocab_size}"
    print(f"GPT of {results.parameters} parameters ({shape}), distributed optimizer, {args.nproc} CPU processes")
    print(
        f"(gloo, DP {args.nproc}); {args.iters} saves per run × {args.rounds} round(s) per format; extra: {passthrough}"
    )
    print(table(results, pp=args.nproc))
    for name, saves in results.saves.items():
        print(f"{name}: save seconds in order {', '.join(f'{s.seconds:.2f}' for s in saves)}")
    for name, outcome in results.loads.items():
        print(f"{name} under PP {args.nproc}: exit {outcome.exit_code}: {outcome.message}")
    print(
        f"bench wall time {time.perf_counter() - started:.0f} s; "
        f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after (1 min)"
    )
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == WORKER:
        worker(sys.argv[2], sys.argv[3:])
    else:
        raise SystemExit(main())
