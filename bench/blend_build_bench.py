#!/usr/bin/env python3
"""A blend of thousands of small datasets, as the preprocessing job array writes it: how long each step takes.

For each prefix count it makes that many datasets (``--docs`` documents of ``--tokens`` tokens each), then times,
in this one process:

- ``tools/merge_datasets.py --write-blend``'s planning and writing (every ``.idx`` opened and checked);
- ``pretrain_gpt.py``'s data checks on the blend file (``preflight``): rank 0's full checks and the
  constant-time ones every other rank does;
- Megatron-Core's ``BlendedMegatronDatasetBuilder`` building the train/valid/test splits with
  ``--data-cache-path`` (cold: every index built and cached), then again (warm: read from the cache, what
  the other ranks and every restart do).

The figures go into docs/performance.md::

    python bench/blend_build_bench.py --prefixes 1000 5000 --work /tmp/blend-bench

Where the hard limit on open files (``ulimit -Hn``) is below what the cached load needs (12 per dataset of a
3-split blend), the data checks refuse the run, as they would a training run; the cold build is still timed.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def make_datasets(root: Path, count: int, docs: int, tokens: int) -> list[str]:
    from megatron_ext.data.indexed import IndexedWriter

    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(count)
    prefixes = []
    for i in range(count):
        prefix = root / f"shard-{i:05d}_text_document"
        if not Path(f"{prefix}.idx").exists():
            writer = IndexedWriter(prefix, np.uint16)
            writer.add_documents(rng.integers(0, 31999, size=docs * tokens), np.full(docs, tokens))
            writer.commit()
        prefixes.append(str(prefix))
    return prefixes


def timed(what: str, fn: Callable[[], Any], results: dict[str, float]) -> Any:
    start = time.perf_counter()
    out = fn()
    results[what] = time.perf_counter() - start
    return out


def run(count: int, work: Path, docs: int, tokens: int) -> dict[str, Any]:
    import resource

    from megatron_ext.config.arguments import ConfigError
    from megatron_ext.config.training_config import parse_args
    from megatron_ext.data.blend_files import plan_blend, with_blend_files, write_blend
    from megatron_ext.data.preflight import Checked, preflight
    from megatron_ext.data.tokenizers import NullTokenizer
    from megatron_ext.training.datasets import build_datasets

    results: dict[str, Any] = {}
    prefixes = make_datasets(work / f"n{count}", count, docs, tokens)
    blend = work / f"blend-{count}.txt"
    blend.unlink(missing_ok=True)
    timed("write blend", lambda: write_blend(plan_blend(prefixes), blend), results)
    cache = work / f"cache-{count}"
    shutil.rmtree(cache, ignore_errors=True)
    run = [
        "--num-layers",
        "2",
        "--hidden-size",
        "64",
        "--num-attention-heads",
        "4",
        "--seq-length",
        "128",
        "--micro-batch-size",
        "4",
        "--global-batch-size",
        "32",
        "--train-iters",
        "1000",
        "--eval-iters",
        "10",
        "--eval-interval",
        "100",
        "--tokenizer-type",
        "NullTokenizer",
        "--vocab-size",
        "31999",
        "--device",
        "cpu",
    ]
    data = ["--data-args-path", str(blend), "--data-cache-path", str(cache), "--split", "90,5,5"]  # fmt: skip
    preflight(parse_args([*run, "--mock-data"]), full=False)  # the imports, untimed
    cfg = parse_args([*run, *data])
    try:
        checked = timed("checks, rank 0 (full)", lambda: preflight(cfg, full=True), results)
        timed("checks, other ranks (constant time)", lambda: preflight(cfg, full=False), results)
    except ConfigError as exc:  # the cached build needs more open files than this machine allows
        results["refused"] = str(exc)
        checked = Checked(cfg=dataclasses.replace(cfg, data=with_blend_files(cfg.data)), tokenizer=NullTokenizer(31999))
    built = timed("Megatron-Core build, cold", lambda: build_datasets(checked.cfg, checked.tokenizer), results)
    results["open files after the cold build"] = open_files()
    del built
    gc.collect()  # the first build's open files (3 per dataset) are closed, as they are in a new process
    if "refused" not in results:
        built = timed("Megatron-Core build, cached", lambda: build_datasets(checked.cfg, checked.tokenizer), results)
        results["open files after the cached build"] = open_files()
        del built
        gc.collect()
    results["open files allowed (ulimit -Hn)"] = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return results


def open_files() -> int:
    return len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else -1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prefixes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--docs", type=int, default=64, help="Documents per dataset.")
    parser.add_argument("--tokens", type=int, default=200, help="Tokens per document.")
    parser.add_argument("--work", type=Path, default=Path("/tmp/blend-bench"))
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # Megatron-Core logs a line per dataset
    import megatron_ext.mcore_import as mcore

    mcore.install()
    import torch.distributed as dist

    from megatron_ext.training.ports import free_port

    # Megatron-Core's blended dataset writes its cache on global rank 0: a group of one process, as a job's rank 0.
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    for count in args.prefixes:
        results = run(count, args.work, args.docs, args.tokens)
        print(f"{count} prefixes ({args.docs} documents of {args.tokens} tokens each):")
        for what, value in results.items():
            shown = f"{value:8.2f} s" if isinstance(value, float) else str(value)
            print(f"  {what:40} {shown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
