#!/usr/bin/env python3
"""How long a process forked from one that has imported torch and Megatron-Core takes to end, side by side:
the interpreter's normal exit against the test suite's (``tests/rank_server.py``'s ``_exit``: what runs at exit,
then ``os._exit``, without freeing every module's objects).

    python bench/forked_exit_bench.py --rounds 5

The parent imports torch and Megatron-Core's model, optimizer and checkpointing modules once, freezes them out
of the collector (as the rank server does), then, alternating the two ways over ``--rounds`` rounds, forks
``--children`` processes at once that each do a little work with torch and end. It prints the median and the
range of the wall time from the fork to the last child's end, per way. A normally ending child frees every
module's objects, which writes to each page it shares with its parent, so each such page is copied first.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import importlib
import os
import statistics
import sys
import threading
import time
from collections.abc import Sequence

IMPORTED = (
    "torch",
    "megatron.core.models.gpt",
    "megatron.core.optimizer",
    "megatron.core.distributed",
    "megatron.core.dist_checkpointing.serialization",
)
"""What the parent imports before it forks (a subset of the rank server's ``PREIMPORTED``)."""

WAYS = ("normal exit", "atexit, then os._exit")


def _child(way: str) -> None:
    import torch

    torch.ones(64, 64) @ torch.ones(64, 64)  # a little work, as a rank would do
    if way == WAYS[0]:
        sys.exit(0)
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def one_round(way: str, children: int) -> float:
    """Wall seconds from the first fork to the last child's end."""
    started = time.perf_counter()
    pids = []
    for _ in range(children):
        pid = os.fork()
        if pid == 0:
            _child(way)
        pids.append(pid)
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"a child ({way}) exited {os.waitstatus_to_exitcode(status)}")
    return time.perf_counter() - started


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="Rounds per way, alternating.")
    parser.add_argument("--children", type=int, default=2, help="Processes forked at once (a run's ranks).")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for name in IMPORTED:
        importlib.import_module(name)
    gc.freeze()
    print(f"forked from a process that imported {', '.join(IMPORTED)}; {args.children} children at once")
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    for _ in range(args.rounds):
        for way in WAYS:
            times[way].append(one_round(way, args.children))
    for way, values in times.items():
        print(
            f"{way:24s} median {statistics.median(values):.2f} s, {min(values):.2f}–{max(values):.2f} s "
            f"over {len(values)} rounds"
        )
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
