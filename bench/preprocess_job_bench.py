#!/usr/bin/env python3
"""The steps of recipes/preprocess_corpus.sh on this machine, timed: what one array task does per core, what the
last step costs, and against one tools/preprocess_data.py run over the same files.

The corpus (built from this machine's text) and the SentencePiece model come from bench/preprocess_bench.py's
cache; the corpus is cut into ``--shards`` ``.json.gz`` files. The job's tasks run one after the other here (each
with ``--workers``), as they would each on a node of their own; then the last step (verify every dataset, write
the blend), the merge alone, and one run over all the files with the same workers. Throughput is MB/s of JSON
text (the work, whatever the compression). The figures go into docs/data.md::

    python bench/preprocess_job_bench.py --corpus-mb 40 --vocab-size 32000 --shards 16 --tasks 4 --workers 2
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import shutil
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def _preprocess_bench() -> Any:
    """bench/preprocess_bench.py's corpus and shard helpers (a script, not a package)."""
    spec = importlib.util.spec_from_file_location("preprocess_bench", REPO / "bench" / "preprocess_bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus-mb", type=float, default=40)
    parser.add_argument("--vocab-size", type=int, default=32000)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--work-dir", type=Path, default=REPO / "runs" / "bench")
    args = parser.parse_args()

    from megatron_ext.data.indexed import merge_datasets
    from megatron_ext.data.preprocess_job import finish, fix_plan, make_plan, run_task

    helpers = _preprocess_bench()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    corpus = args.work_dir / f"corpus-{args.corpus_mb:g}mb.jsonl"
    model = args.work_dir / f"sp{args.vocab_size}-{args.corpus_mb:g}mb.model"
    helpers.prepare(corpus, corpus_mb=args.corpus_mb, model=model, vocab_size=args.vocab_size)
    shards = helpers.shard(corpus, args.shards)
    text = {str(p.resolve()): len(gzip.decompress(p.read_bytes())) for p in shards}
    tokenizer = ["--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model", str(model), "--append-eod",
                 "--quiet"]  # fmt: skip
    out = args.work_dir / "job"
    shutil.rmtree(out, ignore_errors=True)
    plan = fix_plan(
        make_plan([str(p) for p in shards], out, tasks=args.tasks, preprocess_args=tokenizer, keys=["text"])
    )
    print(f"{len(shards)} shards, {sum(text.values()) / 1e6:.1f} MB of JSON text, {plan.tasks} tasks, "
          f"--workers {args.workers}")  # fmt: skip
    total = 0.0
    for task in range(plan.tasks):
        mb = sum(text[f.path] for f in plan.share(task)) / 1e6
        start = time.perf_counter()
        assert run_task(plan, task, workers=args.workers) == 0
        seconds = time.perf_counter() - start
        total += seconds
        print(f"  task {task}: {mb:.1f} MB in {seconds:.1f} s: {mb / seconds:.2f} MB/s, "
              f"{mb / seconds / args.workers:.2f} MB/s per worker")  # fmt: skip
    start = time.perf_counter()
    done = finish(plan, merge=False)
    verify = time.perf_counter() - start
    prefixes = [plan.dataset(f, "text") for f in plan.files]
    start = time.perf_counter()
    merged = merge_datasets(prefixes, out / "merged_text_document")
    merge = time.perf_counter() - start
    bin_mb = merged.num_tokens * merged.dtype.itemsize / 1e6
    single = args.work_dir / "single"
    shutil.rmtree(single, ignore_errors=True)
    single.mkdir()
    import subprocess

    start = time.perf_counter()
    subprocess.run(
        [sys.executable, str(REPO / "tools" / "preprocess_data.py"), "--input", *map(str, shards), "--output-prefix",
         str(single / "all"), "--workers", str(args.workers), *tokenizer],
        check=True,
    )  # fmt: skip
    one = time.perf_counter() - start
    mb = sum(text.values()) / 1e6
    print(
        f"tasks one after the other: {total:.1f} s ({mb / total:.2f} MB/s); one run: {one:.1f} s ({mb / one:.2f} MB/s)"
    )
    print(
        f"last step (verify {done.datasets} datasets, {done.tokens['text']:,} tokens; write the blend): {verify:.2f} s"
    )
    print(f"merge: {bin_mb:.1f} MB of .bin in {merge:.2f} s ({bin_mb / merge:.0f} MB/s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
