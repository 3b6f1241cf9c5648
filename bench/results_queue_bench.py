#!/usr/bin/env python3
"""What the server of Megatron-Core's checkpoint write-results queue costs each rank, side by side: started as
``megatron_ext.training.helper_processes`` starts it (a spawned interpreter that imports this package's
torch-free signal handling), against the same server importing torch (what it did while the helper's import
chain reached ``training.resilience``, which imports torch).

    python bench/results_queue_bench.py --rounds 5

Every rank that saves starts one such server (a spawned interpreter: ``multiprocessing``'s ``spawn`` context, as
Megatron-Core does) and keeps it for the run, so its memory is paid once per rank: eight times per node. The
parent imports what a rank has imported by its first save, then, alternating the two ways over ``--rounds``
rounds, starts a server, measures the wall time until it answers, its CPU time and its resident memory, and
stops it. It prints the median of each, per way.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time
from collections.abc import Callable, Sequence
from multiprocessing.managers import SyncManager

import psutil

from megatron_ext.training.helper_processes import become_helper


def _helper_with_torch(parent: int) -> None:
    import torch  # noqa: F401  (the server as it was: torch came in with the helper's imports)

    become_helper(parent)


WAYS: dict[str, Callable[[int], None]] = {"now (no torch)": become_helper, "importing torch": _helper_with_torch}


def one_server(initializer: Callable[[int], None]) -> tuple[float, float, float]:
    """(seconds until the server answers, its CPU seconds, its resident MiB)."""
    manager = SyncManager(ctx=multiprocessing.get_context("spawn"))
    start = time.monotonic()
    manager.start(initializer=initializer, initargs=(os.getpid(),))
    manager.Queue()  # the first request: the server is up and serving
    wall = time.monotonic() - start
    process = manager._process  # type: ignore[attr-defined]  # the benchmark reads its server's pid
    server = psutil.Process(process.pid)
    cpu = server.cpu_times()
    rss = server.memory_info().rss / 2**20
    manager.shutdown()
    return wall, cpu.user + cpu.system, rss


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    # What a rank has imported by its first save (the server's spawn is then all that is measured).
    from megatron.core.dist_checkpointing.strategies import filesystem_async  # noqa: F401

    results: dict[str, list[tuple[float, float, float]]] = {way: [] for way in WAYS}
    for _ in range(args.rounds):
        for way, initializer in WAYS.items():
            results[way].append(one_server(initializer))
    print(f"{'server':<18} {'start (s)':>10} {'CPU (s)':>8} {'RSS (MiB)':>10}   median of {args.rounds} rounds")
    for way, rows in results.items():
        wall, cpu, rss = (statistics.median(column) for column in zip(*rows, strict=True))
        print(f"{way:<18} {wall:>10.2f} {cpu:>8.2f} {rss:>10.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
