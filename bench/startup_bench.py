#!/usr/bin/env python3
"""Process start-up with and without Megatron-Core's torch.compile'd fusions, side by side.

Each round starts two fresh interpreters, alternating which goes first: one imports Megatron-Core as it
ships (its jit_fuser is torch.compile, whose first use imports TorchDynamo and Inductor), the other the
way ``megatron_ext.training`` imports it on a machine without CUDA (``megatron_ext.mcore_import.install``). The
medians go into docs/performance.md::

    python bench/startup_bench.py --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

MODULES = "megatron.core.models.gpt.gpt_model, megatron.core.pipeline_parallel.schedules, megatron.core.optimizer"
VARIANTS = {
    "as shipped (torch.compile)": f"import {MODULES}",
    "megatron_ext.mcore_import": f"import megatron_ext.mcore_import as m; m.install(); import {MODULES}",
}


def once(code: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-W", "ignore", "-c", code], check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for round_ in range(args.rounds):
        order = list(VARIANTS) if round_ % 2 == 0 else list(reversed(VARIANTS))
        for name in order:
            times[name].append(once(VARIANTS[name]))
    for name, values in times.items():
        print(f"{name:30} median {statistics.median(values):.2f} s, min {min(values):.2f} s over {args.rounds} rounds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
