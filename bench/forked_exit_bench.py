#!/usr/bin/env python3
"""How long a process forked from one that has imported torch and Megatron-Core takes to end, side by side:
the interpreter's normal exit against the test suite's (``tests/rank_server.py``'s ``_exit``: what runs at exit,
then ``os._exit``, without freeing every module's objects).

    python bench/forked_exit_bench.py --rounds 5

The parent imports what a training rank imports once and freezes it out of the collector (as the rank server
does), then, alternating the two ways over ``--rounds`` rounds, forks ``--children`` ranks at once that each run
``pretrain_gpt.py`` (a tiny GPT on mock data, on CPU, pipeline-parallel over the ranks, ``--iters``) and end.
It prints the median and the range of the wall time from the fork to the last child's end, per way. A normally ending child frees every
module's objects, which writes to each page it shares with its parent, so each such page is copied first.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import importlib
import os
import runpy
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from megatron_ext.training.ports import free_port

IMPORTED = (
    "megatron_ext.training.entry",
    "megatron_ext.training.loop",
    "megatron_ext.training.model",
    "megatron.core.models.gpt",
    "megatron.core.optimizer",
    "megatron.core.distributed",
    "megatron.core.pipeline_parallel.schedules",
    "megatron.core.dist_checkpointing.serialization",
    "megatron.core.datasets.gpt_dataset",
    "torch.utils.tensorboard",
    "torch._dynamo",
)
"""What the parent imports before it forks (most of the rank server's ``PREIMPORTED``)."""

WAYS = ("normal exit", "atexit, then os._exit")


REPO = Path(__file__).resolve().parent.parent
TINY = [
    "--mock-data",
    "--device",
    "cpu",
    "--num-layers",
    "4",
    "--hidden-size",
    "64",
    "--num-attention-heads",
    "4",
    "--seq-length",
    "32",
    "--vocab-size",
    "255",
    "--micro-batch-size",
    "2",
    "--global-batch-size",
    "8",
    "--lr",
    "1e-3",
]


def _child(way: str, rank: int, ranks: int, port: int, iters: int) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(ranks), LOCAL_WORLD_SIZE=str(ranks),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
    sys.argv = [str(REPO / "pretrain_gpt.py"), *TINY, "--pipeline-model-parallel-size", str(ranks)]
    sys.argv += ["--train-iters", str(iters)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as exc:
        if exc.code:
            os._exit(1)
    if way == WAYS[0]:
        sys.exit(0)
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def one_round(way: str, children: int, iters: int) -> float:
    """Wall seconds from the first fork to the last child's end."""
    port = free_port()
    started = time.perf_counter()
    pids = []
    for rank in range(children):
        pid = os.fork()
        if pid == 0:
            _child(way, rank, children, port, iters)
        pids.append(pid)
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"a child ({way}) exited {os.waitstatus_to_exitcode(status)}")
    return time.perf_counter() - started


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="Rounds per way, alternating.")
    parser.add_argument("--children", type=int, default=2, help="Ranks forked at once (the pipeline's stages).")
    parser.add_argument("--iters", type=int, default=2, help="Training iterations per run.")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for name in IMPORTED:
        importlib.import_module(name)
    gc.freeze()
    print(f"{args.children} ranks of pretrain_gpt.py ({args.iters} iterations) forked at once from a process that "
          f"imported {', '.join(IMPORTED)}")  # fmt: skip
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    for _ in range(args.rounds):
        for way in WAYS:
            times[way].append(one_round(way, args.children, args.iters))
    for way, values in times.items():
        print(
            f"{way:24s} median {statistics.median(values):.2f} s, {min(values):.2f}–{max(values):.2f} s "
            f"over {len(values)} rounds"
        )
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
