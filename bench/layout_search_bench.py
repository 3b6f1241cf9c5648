#!/usr/bin/env python3
"""Time the layout calculator's search, with and without uneven stage splits, side by side.

Each round runs both searches in one process, alternating which goes first, so that both see the
same machine; the medians go into docs/performance.md::

    python bench/layout_search_bench.py --rounds 7
"""

from __future__ import annotations

import argparse
import statistics
import time

from megatron_ext.config.arguments import ModelArgs
from megatron_ext.config.presets import get_preset
from megatron_ext.estimate.hardware import get_profile
from megatron_ext.estimate.search import Cluster, search
from megatron_ext.estimate.workload import Workload


def once(*, uneven: bool) -> tuple[float, int]:
    """Seconds and candidates of one 1T search on 3072 A100s (bf16, SP, distributed optimizer)."""
    workload = Workload(model=ModelArgs(**get_preset("megatron-1t").model_flags()), precision="bf16")
    cluster = Cluster(gpus=3072, gpus_per_node=8, gpu=get_profile("a100-80g"))
    start = time.perf_counter()
    result = search(
        workload,
        cluster,
        global_batch_size=3072,
        sequence_parallel=True,
        use_distributed_optimizer=True,
        uneven=uneven,
    )
    return time.perf_counter() - start, result.candidates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    times: dict[bool, list[float]] = {True: [], False: []}
    candidates: dict[bool, int] = {}
    for round_index in range(args.rounds):
        for uneven in (True, False) if round_index % 2 == 0 else (False, True):
            seconds, candidates[uneven] = once(uneven=uneven)
            times[uneven].append(seconds)
    for uneven in (False, True):
        label = "even and uneven splits" if uneven else "even splits only"
        print(
            f"{label:<24} median {statistics.median(times[uneven]):.3f} s, min {min(times[uneven]):.3f} s "
            f"over {args.rounds} rounds, {candidates[uneven]} candidates"
        )


if __name__ == "__main__":
    main()
