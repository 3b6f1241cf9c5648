#!/usr/bin/env python3
"""Time the layout calculator's search, side by side: with and without uneven stage splits (the 1T model on
3072 A100s), and with and without context parallelism (Llama 3.1 8B at 128k tokens on 1024 H100s, where CP up
to 32 is tried).

Each round runs each pair in one process, alternating which goes first, so that both see the same machine;
the medians go into docs/performance.md::

    python bench/layout_search_bench.py --rounds 7
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

from megatron_ext.config.arguments import ModelArgs
from megatron_ext.config.presets import get_preset
from megatron_ext.estimate.hardware import get_profile
from megatron_ext.estimate.search import Cluster, search
from megatron_ext.estimate.workload import Workload

LONG_CONTEXT = 131072


def _one_t(**options: Any) -> tuple[float, int]:
    """Seconds and candidates of one 1T search on 3072 A100s (bf16, SP, distributed optimizer)."""
    workload = Workload(model=ModelArgs(**get_preset("megatron-1t").model_flags()), precision="bf16")
    cluster = Cluster(gpus=3072, gpus_per_node=8, gpu=get_profile("a100-80g"))
    start = time.perf_counter()
    result = search(
        workload, cluster, global_batch_size=3072, sequence_parallel=True, use_distributed_optimizer=True, **options
    )
    return time.perf_counter() - start, result.candidates


def _long_context(**options: Any) -> tuple[float, int]:
    """Seconds and candidates of one Llama 3.1 8B search at 128k tokens on 1024 H100s (batch 64)."""
    model = dataclasses.replace(
        ModelArgs(**get_preset("llama3.1-8b").model_flags()),
        seq_length=LONG_CONTEXT,
        max_position_embeddings=LONG_CONTEXT,
    )
    cluster = Cluster(gpus=1024, gpus_per_node=8, gpu=get_profile("h100-sxm"))
    start = time.perf_counter()
    result = search(
        Workload(model=model, precision="bf16"),
        cluster,
        global_batch_size=64,
        sequence_parallel=True,
        use_distributed_optimizer=True,
        **options,
    )
    return time.perf_counter() - start, result.candidates


Timed = tuple[str, Callable[..., tuple[float, int]], dict[str, Any]]
"""A label, the search to time, and its options."""

PAIRS: dict[str, tuple[Timed, Timed]] = {
    "1T on 3072 A100s": (("even splits only", _one_t, {"uneven": False}), ("even and uneven splits", _one_t, {})),
    f"Llama 3.1 8B at {LONG_CONTEXT} tokens on 1024 H100s": (
        ("CP 1 only", _long_context, {"cp": 1}),
        ("CP searched", _long_context, {}),
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    for title, pair in PAIRS.items():
        times: dict[str, list[float]] = {label: [] for label, _, _ in pair}
        candidates: dict[str, int] = {}
        for round_index in range(args.rounds):
            for label, run, options in pair if round_index % 2 == 0 else reversed(pair):
                seconds, candidates[label] = run(**options)
                times[label].append(seconds)
        print(title)
        for label, _, _ in pair:
            print(
                f"  {label:<24} median {statistics.median(times[label]):.3f} s, min {min(times[label]):.3f} s "
                f"over {args.rounds} rounds, {candidates[label]} candidates"
            )


if __name__ == "__main__":
    main()
