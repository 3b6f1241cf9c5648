#!/usr/bin/env python3
"""Benchmark tools/preprocess_data.py as whole processes, on a corpus built from this machine's text.

Each of ``--runs`` rounds starts the tool as a fresh process and measures
wall-clock MB/s (input bytes), documents/s, tokens/s, CPU seconds of the whole
process tree and peak resident memory (the sum over the process tree, sampled
every 20 ms, and the largest single process from GNU ``time``). Each round
also measures the tokenizer alone: the same texts, already in memory, encoded
with all cores (the better of one threaded SentencePiece batch call and one
process per core). Rounds interleave the contenders, so that other load on a
shared machine hits them alike; the best round and the median are reported. With ``--reference-tool PATH`` (Megatron-LM's ``tools/preprocess_data.py``;
its repository root must be importable, see ``--reference-pythonpath``) the
reference runs the same input at the same ``--workers``, and the outputs of
both are compared byte for byte::

    python bench/preprocess_bench.py --corpus-mb 50 --vocab-size 32000 --workers 2 --runs 3
    python bench/preprocess_bench.py --reference-tool ~/Megatron-LM/tools/preprocess_data.py
    python bench/preprocess_bench.py --formats jsonl.gz jsonl.zst parquet arrow --shards 200

``--formats`` adds the same corpus converted to other input formats (cached
next to it) and ``--shards N`` the corpus cut into N ``.json.gz`` files, as
further contenders in the same interleaved rounds; their outputs must be
byte-identical to the JSON Lines run, and their throughput is reported as MB/s
of the JSON Lines text (the same work for every format) and as a ratio to it.

The corpus (``megatron_ext.data.local_corpus``) and the tokenizer are cached under ``--work-dir``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from megatron_ext.data.local_corpus import build_corpus

REPO = Path(__file__).resolve().parent.parent


def _secs(values: Any) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants (shared pages counted in each)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total


def run_measured(cmd: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run ``cmd``: wall time, peak RSS summed over its process tree (sampled every 20 ms) and the
    largest single process's peak RSS (``/usr/bin/time -f %M``, which covers the reaped workers too)."""
    timer = shutil.which("time", path="/usr/bin")
    full = [timer, "-f", "%M %U %S", *cmd] if timer else cmd
    start = time.perf_counter()
    proc = subprocess.Popen(full, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, tree_rss(proc.pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err = proc.communicate()
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{err[-3000:]}")
    # GNU time: max RSS (KiB) of the largest process, CPU seconds of the whole tree.
    rss_kib, user, system = (float(x) for x in err.strip().splitlines()[-1].split()) if timer else (0.0,) * 3
    return {
        "seconds": seconds,
        "cpu_seconds": user + system,
        "peak_tree_rss_mb": peak / 1e6,
        "peak_process_rss_mb": rss_kib / 1e3,
    }


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            h.update(block)
    return h.hexdigest()


def tokenizer_alone(corpus: Path, model: Path, tokenizer_type: str, cores: int) -> dict[str, Any]:
    """One round: the corpus' texts, parsed beforehand and held in memory, encoded with all cores in two
    ways: one SentencePiece batch call with ``num_threads=cores``, and ``cores`` forked processes that
    each encode their share with one batch call. Runs in a child process (keeps this one small)."""
    code = f"""
import json, os, resource, sys, time
from megatron_ext.data.tokenizers import build_tokenizer
sp = build_tokenizer({tokenizer_type!r}, tokenizer_model={str(model)!r}).sp
texts = [json.loads(line)["text"] for line in open({str(corpus)!r}, encoding="utf-8")]
cores = {cores}
def cpu():
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime
def threads():
    return sum(a.size for a in sp.encode(texts, return_type="numpy", num_threads=cores))
def processes():
    pids = []
    for k in range(cores):
        pid = os.fork()
        if pid == 0:
            sp.encode(texts[k::cores], return_type="numpy", num_threads=1)
            os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
out = {{"documents": len(texts)}}
for name, fn in (("threads", threads), ("processes", processes)):
    c, t = cpu(), time.perf_counter()
    tokens = fn()
    out[name] = time.perf_counter() - t
    out[name + "_cpu"] = cpu() - c
    out["tokens"] = tokens if name == "threads" else out["tokens"]
print(json.dumps(out))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    out = json.loads(proc.stdout)
    best = "threads" if out["threads"] <= out["processes"] else "processes"
    return {**out, "best": best, "seconds": out[best], "cpu_seconds": out[best + "_cpu"]}


def convert(corpus: Path, fmt: str) -> Path:
    """The corpus as ``fmt`` next to it (made once): zstd level 3, gzip level 6, Parquet (snappy, row
    groups of 1,000 documents) or an Arrow IPC stream, as the hubs and ``datasets`` write them."""
    target = corpus.with_name(f"{corpus.stem}.{fmt}")
    if target.exists():
        return target
    tmp = target.with_name(f".{target.name}.tmp")
    print(f"writing {target} ...", flush=True)
    if fmt in ("jsonl.gz", "jsonl.zst"):
        import gzip

        import zstandard

        with open(corpus, "rb") as src, open(tmp, "wb") as raw:
            if fmt == "jsonl.gz":
                with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6) as out:
                    shutil.copyfileobj(src, out, 1 << 20)
            else:
                zstandard.ZstdCompressor(level=3).copy_stream(src, raw)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        texts: dict[str, list[str]] = {"text": [], "source": []}
        with open(corpus, encoding="utf-8") as f:
            for line in f:
                record = json.loads(line)
                for key, values in texts.items():
                    values.append(record.get(key, ""))
        table = pa.table(texts)
        if fmt == "parquet":
            pq.write_table(table, tmp, row_group_size=1000)
        else:
            with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table, max_chunksize=1000)
    os.replace(tmp, target)
    return target


def shard(corpus: Path, n: int) -> list[Path]:
    """The corpus cut into ``n`` gzip files of whole documents (made once), as Dolma ships ``.json.gz``."""
    import gzip

    directory = corpus.with_name(f"{corpus.stem}-{n}-shards")
    paths = [directory / f"part-{i:05d}.json.gz" for i in range(n)]
    if directory.is_dir() and all(p.exists() for p in paths):
        return paths
    print(f"writing {n} shards to {directory} ...", flush=True)
    directory.mkdir(exist_ok=True)
    lines = corpus.read_bytes().splitlines(keepends=True)
    per = -(-len(lines) // n)
    for i, path in enumerate(paths):
        path.write_bytes(gzip.compress(b"".join(lines[i * per : (i + 1) * per]), compresslevel=6))
    return paths


def prepare(corpus: Path, *, corpus_mb: float, model: Path, vocab_size: int) -> None:
    """Build the corpus from this machine's text and train the SentencePiece model on it, unless they exist."""
    if not corpus.exists():
        print(f"building {corpus} ({corpus_mb} MB from this machine's text) ...", flush=True)
        build_corpus(corpus, target_mb=corpus_mb)
    if not model.exists():
        print(f"training {model} ...", flush=True)
        subprocess.run(
            [sys.executable, str(REPO / "tools" / "train_tokenizer.py"), "--input", str(corpus), "--model-prefix",
             str(model.with_suffix("")), "--vocab-size", str(vocab_size), "--byte-fallback"],
            check=True,
        )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work-dir", default=str(REPO / "runs" / "bench"), help="Cache for corpus, tokenizer, outputs.")
    p.add_argument("--corpus", help="JSON Lines corpus (default: built from this machine's text).")
    p.add_argument("--corpus-mb", type=float, default=50.0, help="Size of the built corpus.")
    p.add_argument("--tokenizer-model", help="SentencePiece model (default: trained on the corpus).")
    p.add_argument("--vocab-size", type=int, default=32000, help="Vocabulary of the trained tokenizer.")
    p.add_argument(
        "--tokenizer-type",
        default="GPTSentencePieceTokenizer",
        choices=["GPTSentencePieceTokenizer", "SentencePieceTokenizer"],
    )
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--reference-tool", help="Megatron-LM's tools/preprocess_data.py, to run side by side.")
    p.add_argument("--reference-pythonpath", help="PYTHONPATH for the reference (default: the tool's repo root).")
    p.add_argument(
        "--scale",
        type=int,
        nargs="+",
        default=[1],
        help="Also run ours on the corpus repeated K times (memory must not grow with size).",
    )
    p.add_argument(
        "--formats",
        nargs="*",
        default=[],
        choices=["jsonl.gz", "jsonl.zst", "parquet", "arrow"],
        help="Also run the corpus converted to these formats (same documents).",
    )
    p.add_argument("--shards", type=int, default=0, help="Also run the corpus cut into this many .json.gz files.")
    p.add_argument("--results", help="Write all measurements to this JSON file.")
    args = p.parse_args(argv)

    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    corpus = Path(args.corpus) if args.corpus else work / f"corpus{args.corpus_mb:g}.jsonl"
    model = Path(args.tokenizer_model) if args.tokenizer_model else work / f"sp{args.vocab_size}.model"
    prepare(corpus, corpus_mb=args.corpus_mb, model=model, vocab_size=args.vocab_size)
    size = corpus.stat().st_size
    env = dict(os.environ, OMP_NUM_THREADS="1")
    common = [
        "--json-keys",
        "text",
        "--tokenizer-type",
        args.tokenizer_type,
        "--tokenizer-model",
        str(model),
        "--append-eod",
        "--workers",
        str(args.workers),
    ]
    results: dict[str, Any] = {
        "corpus": str(corpus),
        "corpus_bytes": size,
        "tokenizer_model": str(model),
        "workers": args.workers,
        "cpus": len(os.sched_getaffinity(0)),
        "date": time.strftime("%Y-%m-%d"),
    }

    def summarize(name: str, runs: list[dict[str, Any]], docs: int, tokens: int) -> dict[str, Any]:
        secs = [r["seconds"] for r in runs]
        best, median = min(secs), statistics.median(secs)
        row = {
            "runs": runs,
            "best_seconds": best,
            "median_seconds": median,
            "mb_per_s_best": size / best / 1e6,
            "mb_per_s_median": size / median / 1e6,
            "docs_per_s_best": docs / best,
            "tokens_per_s_best": tokens / best,
            "cpu_seconds_median": statistics.median(r["cpu_seconds"] for r in runs),
            "peak_tree_rss_mb": max(r.get("peak_tree_rss_mb", 0.0) for r in runs),
            "peak_process_rss_mb": max(r.get("peak_process_rss_mb", 0.0) for r in runs),
        }
        memory = (
            f" | peak RSS tree {row['peak_tree_rss_mb']:5.0f} MB, largest process {row['peak_process_rss_mb']:4.0f} MB"
            if row["peak_tree_rss_mb"]
            else " | (texts in memory)"
        )
        print(
            f"{name:<22} {row['mb_per_s_best']:6.2f} MB/s (median {row['mb_per_s_median']:5.2f}) "
            f"{row['docs_per_s_best']:6,.0f} docs/s {row['tokens_per_s_best']:10,.0f} tokens/s "
            f"cpu {row['cpu_seconds_median']:5.1f} s{memory} | runs {_secs(secs)} s",
            flush=True,
        )
        return row

    out = work / "out"
    out.mkdir(exist_ok=True)
    ours_cmd = [
        sys.executable,
        str(REPO / "tools" / "preprocess_data.py"),
        "--quiet",
        "--input",
        str(corpus),
        "--output-prefix",
        str(out / "ours"),
        *common,
    ]
    ref_cmd: list[str] | None = None
    ref_env = env
    if args.reference_tool:
        ref_tool = Path(args.reference_tool).resolve()
        ref_env = dict(env, PYTHONPATH=args.reference_pythonpath or str(ref_tool.parent.parent))
        ref_cmd = [
            sys.executable,
            str(ref_tool),
            "--input",
            str(corpus),
            "--output-prefix",
            str(out / "reference"),
            "--log-interval",
            "1000000000",
            *common,
        ]
    variants = {fmt: [convert(corpus, fmt)] for fmt in args.formats}
    if args.shards:
        variants[f"{args.shards} shards"] = shard(corpus, args.shards)
    variant_cmds = {}
    for name, paths in variants.items():
        cmd = [*ours_cmd]
        at = cmd.index("--input")
        cmd[at + 1 : at + 2] = [str(p) for p in paths]
        cmd[cmd.index("--output-prefix") + 1] = str(out / name.replace(" ", "-"))
        variant_cmds[name] = cmd
    # Interleaved rounds, so that load from other users of the machine hits every contender alike.
    alone_runs: list[dict[str, Any]] = []
    ours_runs: list[dict[str, Any]] = []
    ref_runs: list[dict[str, Any]] = []
    variant_runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    for _ in range(args.runs):
        alone_runs.append(tokenizer_alone(corpus, model, args.tokenizer_type, results["cpus"]))
        ours_runs.append(run_measured(ours_cmd, env))
        for name, cmd in variant_cmds.items():
            variant_runs[name].append(run_measured(cmd, env))
        if ref_cmd is not None:
            ref_runs.append(run_measured(ref_cmd, ref_env))
    docs, tokens = alone_runs[0]["documents"], alone_runs[0]["tokens"]
    print(
        f"corpus {corpus}: {size / 1e6:.1f} MB, {docs:,} documents, {tokens:,} tokens (without eod); "
        f"{args.workers} workers, {results['cpus']} cores; best of {args.runs} interleaved runs"
    )
    results["tokenizer_alone"] = summarize("tokenizer alone", alone_runs, docs, tokens)
    results["ours"] = summarize("ours", ours_runs, docs, tokens)
    for name, runs in variant_runs.items():
        row = summarize(f"ours, {name}", runs, docs, tokens)
        row["input_bytes"] = sum(p.stat().st_size for p in variants[name])
        row["identical_output"] = all(
            sha256(out / f"ours_text_document.{ext}") == sha256(out / f"{name.replace(' ', '-')}_text_document.{ext}")
            for ext in ("bin", "idx")
        )
        row["vs_jsonl_best"] = results["ours"]["best_seconds"] / row["best_seconds"]
        row["vs_jsonl_median"] = results["ours"]["median_seconds"] / row["median_seconds"]
        results[f"ours_{name}"] = row
        print(
            f"  {name}: {row['input_bytes'] / 1e6:.1f} MB on disk, output byte-identical: {row['identical_output']}; "
            f"throughput {row['vs_jsonl_best']:.1%} of JSON Lines (median {row['vs_jsonl_median']:.1%})",
            flush=True,
        )
    if ref_cmd is not None:
        results["reference"] = summarize("Megatron-LM reference", ref_runs, docs, tokens)
        same = all(
            sha256(out / f"ours_text_document.{ext}") == sha256(out / f"reference_text_document.{ext}")
            for ext in ("bin", "idx")
        )
        results["identical_output"] = same
        results["speedup_vs_reference"] = results["reference"]["best_seconds"] / results["ours"]["best_seconds"]
        print(
            f"outputs byte-identical: {same}; ours / reference: {results['speedup_vs_reference']:.2f}x "
            f"(median {results['reference']['median_seconds'] / results['ours']['median_seconds']:.2f}x)"
        )
    results["ours_vs_tokenizer_alone"] = results["tokenizer_alone"]["best_seconds"] / results["ours"]["best_seconds"]
    print(
        f"ours / tokenizer alone: {results['ours_vs_tokenizer_alone']:.1%} (median "
        f"{results['tokenizer_alone']['median_seconds'] / results['ours']['median_seconds']:.1%})"
    )

    for k in args.scale:
        if k == 1:
            continue
        big = work / f"{corpus.stem}_x{k}.jsonl"
        if not big.exists():
            with open(big, "wb") as f:
                for _ in range(k):
                    f.write(corpus.read_bytes())
        cmd = [*ours_cmd]
        cmd[cmd.index("--input") + 1] = str(big)
        run = run_measured(cmd, env)
        results[f"ours_x{k}"] = run
        print(
            f"ours on {k}x the corpus ({big.stat().st_size / 1e6:.0f} MB): {big.stat().st_size / run['seconds'] / 1e6:.2f}"
            f" MB/s, peak RSS tree {run['peak_tree_rss_mb']:.0f} MB, largest process {run['peak_process_rss_mb']:.0f} MB"
        )
        big.unlink()
    if args.results:
        Path(args.results).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
