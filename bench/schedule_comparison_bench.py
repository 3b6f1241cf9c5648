#!/usr/bin/env python3
"""Time the layout calculator's search and its ``--compare-schedules`` on every layout the search produces.

For every model preset (its published global batch, else 1,024 sequences), on clusters of 8, 64, 512 and 3,072
H100s, it runs the search (even and uneven stage splits, sequence parallelism and the distributed optimizer, as
``tools/layout.py --search`` with both) and then compares the schedules of its best layouts (``--layouts``; 0:
every valid layout it found, fitting or not). One row per model and cluster, the slowest answers last; the
figures go into docs/performance.md (the goal: every answer within 2 s)::

    python bench/schedule_comparison_bench.py --layouts 3

``--layout TP,PP,VP,MICROBATCHES`` (repeatable) times only the layouts found with those factors: the slow ones of
an earlier run, timed again (with ``PYTHONPATH`` at another checkout, the same layouts under other code).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

from megatron_ext.config.arguments import ModelArgs
from megatron_ext.config.presets import PRESETS
from megatron_ext.estimate.hardware import get_profile
from megatron_ext.estimate.schedule_comparison import compare_schedules
from megatron_ext.estimate.search import Cluster, search
from megatron_ext.estimate.workload import Workload

DEFAULT_BATCH = 1024
"""Sequences per step for a preset whose source publishes none."""


@dataclasses.dataclass
class Slowest:
    """The slowest answer of one kind and what it answered."""

    seconds: float = 0.0
    what: str = ""

    def see(self, seconds: float, what: str) -> None:
        if seconds > self.seconds:
            self.seconds, self.what = seconds, what


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=[8, 64, 512, 3072])
    parser.add_argument("--gpu", default="h100-sxm", help="hardware profile (tools/layout.py --gpu)")
    parser.add_argument("--models", nargs="+", choices=list(PRESETS), help="presets (default: every one)")
    parser.add_argument("--limit", type=float, default=2.0, help="seconds an answer may take")
    parser.add_argument(
        "--layouts",
        type=int,
        default=1,
        help="compare the schedules of the search's best N layouts (1: what tools/layout.py --search "
        "--compare-schedules answers; 0: every valid layout the search found, which takes hours today)",
    )
    parser.add_argument(
        "--layout",
        action="append",
        type=_factors,
        default=[],
        metavar="TP,PP,VP,MICROBATCHES",
        help="compare only the layouts found with these factors (repeatable; with --layouts 0 to look at all)",
    )
    args = parser.parse_args()
    gpu = get_profile(args.gpu)
    search_s: list[float] = []
    compare_s: list[float] = []
    slowest_search, slowest_compare = Slowest(), Slowest()
    over = 0
    start = time.perf_counter()
    print(f"{'model':<14} {'GPUs':>5} {'search s':>9} {'layouts':>8} {'compare s (max)':>16}  slowest layout compared")
    presets = [PRESETS[name] for name in args.models] if args.models else list(PRESETS.values())
    for preset in presets:
        batch = preset.global_batch_size or DEFAULT_BATCH
        workload = Workload(model=ModelArgs(**preset.model_flags()), precision="bf16")
        for gpus in args.gpus:
            cluster = Cluster(gpus=gpus, gpus_per_node=8, gpu=gpu)
            name = f"{preset.name} on {gpus} GPUs"
            t0 = time.perf_counter()
            result = search(
                workload, cluster, global_batch_size=batch, sequence_parallel=True, use_distributed_optimizer=True
            )
            seconds = time.perf_counter() - t0
            search_s.append(seconds)
            slowest_search.see(seconds, f"{name}: {result.candidates} candidates")
            over += seconds > args.limit
            row = Slowest()
            for estimate in result.estimates[: args.layouts or None]:
                layout = estimate.layout
                if args.layout and (layout.tp, layout.pp, layout.vp, layout.num_microbatches) not in args.layout:
                    continue
                t0 = time.perf_counter()
                compare_schedules(workload, estimate)
                seconds = time.perf_counter() - t0
                compare_s.append(seconds)
                cp = f" CP {layout.cp}" if layout.cp > 1 else ""
                what = f"TP {layout.tp}{cp} PP {layout.pp} VP {layout.vp}, {layout.num_microbatches} microbatches"
                row.see(seconds, what)
                slowest_compare.see(seconds, f"{name}: {what}")
                over += seconds > args.limit
            print(
                f"{preset.name:<14} {gpus:>5} {search_s[-1]:>9.3f} {len(result.estimates):>8} {row.seconds:>16.3f}  "
                f"{row.what}",
                flush=True,
            )
    print(
        f"searches        {len(search_s):5d}  median {statistics.median(search_s):.3f} s  "
        f"max {slowest_search.seconds:.3f} s ({slowest_search.what})"
    )
    print(
        f"--compare-schedules {len(compare_s):5d} layouts  median {statistics.median(compare_s or [0.0]):.3f} s  "
        f"max {slowest_compare.seconds:.3f} s ({slowest_compare.what})"
    )
    print(f"answers over {args.limit:g} s: {over}; bench wall time {time.perf_counter() - start:.0f} s")


def _factors(text: str) -> tuple[int, ...]:
    try:
        factors = tuple(int(part) for part in text.split(","))
    except ValueError:
        factors = ()
    if len(factors) != 4:
        raise argparse.ArgumentTypeError(f"expected TP,PP,VP,MICROBATCHES (four integers), got {text!r}")
    return factors


if __name__ == "__main__":
    main()
