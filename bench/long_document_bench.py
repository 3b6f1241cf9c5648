#!/usr/bin/env python3
"""Peak memory and time of tools/preprocess_data.py on one very long document, side by side.

One JSON Lines record whose text is ``--document-mb`` MB (the corpus' documents
joined with blank lines) is preprocessed by each contender as a fresh process,
in interleaved rounds; the same text cut into its ordinary documents is the
control (what memory and time look like without a long document). Each run
reports wall-clock seconds, CPU seconds of the whole process tree, the peak RSS
of the largest single process (GNU ``time``) and of the process tree (sampled
every 20 ms), and the outputs of the long-document runs are compared byte for
byte (``.bin`` and ``.idx`` SHA-256).

``--baseline REV`` adds the tool as it was at git revision ``REV`` (extracted
with ``git archive`` into ``--work-dir``; the working tree is not touched), so
that before and after run in the same rounds on the same machine::

    python bench/long_document_bench.py --document-mb 30 --baseline HEAD --runs 2
    python bench/long_document_bench.py --document-mb 30 --tokenizer-model runs/tok/sp32k.model

The corpus (``megatron_ext.data.local_corpus``) and the tokenizer (a SentencePiece BPE
trained on it with ``tools/train_tokenizer.py``) are cached under ``--work-dir``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

from preprocess_bench import prepare, run_measured, sha256  # bench/ is sys.path[0] when this runs as a script

REPO = Path(__file__).resolve().parent.parent


def baseline_tree(rev: str, work: Path) -> Path:
    """``megatron_ext/`` and ``tools/`` as they were at ``rev``, extracted once under ``work``."""
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", f"{rev}^{{commit}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    target = work / f"baseline-{commit[:12]}"
    if not (target / "tools" / "preprocess_data.py").exists():
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", "--format=tar", commit, "megatron_ext", "tools"],
            capture_output=True,
            check=True,
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(target, filter="data")
    return target


def long_document(corpus: Path, megabytes: float, target: Path) -> tuple[Path, Path]:
    """(one record of ``megabytes`` MB of text, the same text as the corpus' own documents), made once."""
    control = target.with_name(f"{target.stem}-control.jsonl")
    if target.exists() and control.exists():
        return target, control
    texts: list[str] = []
    size = 0
    limit = int(megabytes * 1e6)
    with open(corpus, encoding="utf-8") as f:
        for line in f:
            text = json.loads(line)["text"]
            texts.append(text[: limit - size])
            size += len(texts[-1].encode("utf-8")) + 2
            if size >= limit:
                break
    if size < limit:
        raise SystemExit(f"the corpus has only {size / 1e6:.1f} MB of text; pass a larger --corpus-mb")
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(json.dumps({"text": "\n\n".join(texts)}) + "\n", encoding="utf-8")
    os.replace(tmp, target)
    tmp.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    os.replace(tmp, control)
    return target, control


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--work-dir", default=str(REPO / "runs" / "bench-long"), help="Cache for corpus, tokenizer, outputs."
    )
    p.add_argument("--corpus-mb", type=float, default=40.0, help="Size of the built corpus (>= --document-mb).")
    p.add_argument("--document-mb", type=float, default=30.0, help="Size of the one long document, in MB of UTF-8.")
    p.add_argument("--tokenizer-model", help="SentencePiece model (default: a BPE trained on the corpus).")
    p.add_argument("--vocab-size", type=int, default=32000, help="Vocabulary of the trained tokenizer.")
    p.add_argument("--tokenizer-type", default="GPTSentencePieceTokenizer")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--runs", type=int, default=1, help="Interleaved rounds.")
    p.add_argument("--baseline", help="Also run the tool of this git revision (e.g. HEAD), side by side.")
    p.add_argument("--no-control", action="store_true", help="Leave out the same text as ordinary documents.")
    p.add_argument("--results", help="Write all measurements to this JSON file.")
    args = p.parse_args(argv)

    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / f"corpus-{args.corpus_mb:g}mb.jsonl"
    model = Path(args.tokenizer_model) if args.tokenizer_model else work / f"sp{args.vocab_size}.model"
    prepare(corpus, corpus_mb=args.corpus_mb, model=model, vocab_size=args.vocab_size)
    document, control = long_document(corpus, args.document_mb, work / f"long-{args.document_mb:g}mb.jsonl")

    env = dict(os.environ, OMP_NUM_THREADS="1")
    trees = {"after (working tree)": REPO}
    if args.baseline:
        trees = {f"before ({args.baseline})": baseline_tree(args.baseline, work), **trees}
    contenders: dict[str, tuple[Path, Path]] = {name: (tree, document) for name, tree in trees.items()}
    if not args.no_control:
        contenders["control: the same text as its documents"] = (REPO, control)

    def command(tree: Path, inp: Path, name: str) -> list[str]:
        out = work / "out" / name.split(" ")[0].strip(":")
        out.parent.mkdir(exist_ok=True)
        return [
            sys.executable, str(tree / "tools" / "preprocess_data.py"), "--input", str(inp), "--output-prefix",
            str(out), "--tokenizer-type", args.tokenizer_type, "--tokenizer-model", str(model), "--append-eod",
            "--workers", str(args.workers), "--quiet",
        ]  # fmt: skip

    results: dict[str, list[dict[str, Any]]] = {name: [] for name in contenders}
    digests: dict[str, set[tuple[str, str]]] = {name: set() for name in contenders}
    for round_ in range(args.runs):
        for name, (tree, inp) in contenders.items():
            print(f"round {round_ + 1}/{args.runs}: {name} ...", flush=True)
            run = run_measured(command(tree, inp, name), dict(env, PYTHONPATH=str(tree)))
            results[name].append(run)
            out = work / "out" / f"{name.split(' ')[0].strip(':')}_text_document"
            digests[name].add((sha256(Path(f"{out}.bin")), sha256(Path(f"{out}.idx"))))

    long_runs = [name for name in contenders if not name.startswith("control")]
    identical = len(set().union(*(digests[name] for name in long_runs))) == 1
    text_mb = document.stat().st_size / 1e6
    print(
        f"\none document of {text_mb:,.1f} MB (JSON Lines), {args.tokenizer_type} {model.name}, "
        f"--workers {args.workers}, {args.runs} round(s)"
    )
    header = f"{'':44} {'seconds (best)':>14} {'median':>8} {'CPU s':>7} {'peak RSS, largest process':>26} {'tree':>9}"
    print(header)
    summary: dict[str, Any] = {}
    for name, runs in results.items():
        best = min(runs, key=lambda r: r["seconds"])
        row = {
            "seconds_best": best["seconds"],
            "seconds_median": statistics.median(r["seconds"] for r in runs),
            "cpu_seconds": best["cpu_seconds"],
            "peak_process_rss_mb": max(r["peak_process_rss_mb"] for r in runs),
            "peak_tree_rss_mb": max(r["peak_tree_rss_mb"] for r in runs),
        }
        summary[name] = row
        print(
            f"{name:44} {row['seconds_best']:>14.1f} {row['seconds_median']:>8.1f} {row['cpu_seconds']:>7.1f} "
            f"{row['peak_process_rss_mb']:>23,.0f} MB {row['peak_tree_rss_mb']:>6,.0f} MB"
        )
    print(f"long-document outputs byte-identical across contenders and rounds: {identical}")
    if args.results:
        Path(args.results).write_text(
            json.dumps({"document_mb": text_mb, "identical": identical, "summary": summary, "runs": results}, indent=2)
        )
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
