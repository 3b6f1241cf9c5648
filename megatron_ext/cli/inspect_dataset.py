"""Inspect a Megatron indexed dataset: counts, length histogram, decoded documents, integrity.

::

    python tools/inspect_dataset.py runs/demo-data/stdlib_text_document
    python tools/inspect_dataset.py PREFIX --verify
    python tools/inspect_dataset.py PREFIX --show 2 --tokenizer-type GPTSentencePieceTokenizer --tokenizer-model tok.model

``--verify`` checks that the ``.idx`` and the ``.bin`` agree (header, sizes,
pointers, document indices; with a tokenizer also that every token id is in
its vocabulary) and exits 1 with the problems named otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from megatron_ext.config.exit_codes import ExitCode, fail
from megatron_ext.config.flags import Parser, at_least
from megatron_ext.config.tokenizer_types import TOKENIZER_TYPES, tokenizer_type_argument
from megatron_ext.data.indexed import IndexedDatasetError, IndexedDatasetFiles
from megatron_ext.data.tokenizer_base import TokenizerError
from megatron_ext.data.tokenizers import build_tokenizer


def histogram(lengths: np.ndarray, bins: int = 10) -> list[tuple[int, int, int]]:
    """(low, high, count) over power-of-two-ish buckets of sequence lengths."""
    if lengths.size == 0:
        return []
    hi = int(lengths.max())
    edges = np.unique(np.geomspace(1, max(hi, 2) + 1, num=bins + 1).astype(np.int64))
    counts, edges = np.histogram(lengths, bins=edges)
    return [(int(edges[i]), int(edges[i + 1]) - 1, int(c)) for i, c in enumerate(counts)]


def main(argv: list[str] | None = None) -> int:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prefix", help="Dataset prefix (without .bin/.idx).")
    p.add_argument("--verify", action="store_true", help="Check that .idx and .bin agree; exit 1 if not.")
    p.add_argument("--show", type=at_least(0), default=0, help="Decode the first N documents (needs a tokenizer).")
    p.add_argument("--max-chars", type=at_least(1), default=500, help="Characters shown per decoded document.")
    p.add_argument("--json", action="store_true", help="Print the statistics as JSON.")
    p.add_argument(
        "--tokenizer-type",
        type=tokenizer_type_argument,
        metavar="{" + ",".join(TOKENIZER_TYPES) + "}",
        help="Tokenizer to decode with.",
    )
    p.add_argument("--tokenizer-model", help="SentencePiece .model or Hugging Face directory.")
    p.add_argument("--vocab-file", help="GPT2BPETokenizer vocab.json.")
    p.add_argument("--merge-file", help="GPT2BPETokenizer merges.txt.")
    p.add_argument("--vocab-size", type=at_least(1), help="NullTokenizer vocabulary size.")
    args = p.parse_args(argv)
    prefix = args.prefix[:-4] if args.prefix.endswith((".bin", ".idx")) else args.prefix
    try:
        ds = IndexedDatasetFiles.open(prefix)
        tokenizer = None
        if args.tokenizer_type:
            tokenizer = build_tokenizer(
                args.tokenizer_type,
                tokenizer_model=args.tokenizer_model,
                vocab_file=args.vocab_file,
                merge_file=args.merge_file,
                vocab_size=args.vocab_size,
            )
        elif args.show:
            raise TokenizerError("--show needs --tokenizer-type (and its model files) to decode")
    except (IndexedDatasetError, TokenizerError) as exc:
        return fail(exc, ExitCode.ERROR)

    lengths = np.asarray(ds.lengths)
    stats = {
        "prefix": prefix,
        "dtype": str(ds.dtype),
        "documents": ds.num_documents,
        "sequences": ds.num_sequences,
        "tokens": int(lengths.sum(dtype=np.int64)),
        "empty_documents": int(np.sum(np.diff(ds.document_indices) == 0)) if ds.document_indices.size else 0,
        "length_min": int(lengths.min()) if lengths.size else 0,
        "length_mean": float(lengths.mean()) if lengths.size else 0.0,
        "length_median": float(np.median(lengths)) if lengths.size else 0.0,
        "length_max": int(lengths.max()) if lengths.size else 0,
        "bin_bytes": ds.bin_bytes,
        "histogram": [{"from": a, "to": b, "sequences": c} for a, b, c in histogram(lengths)],
    }
    if args.json:
        print(json.dumps(stats, indent=2))
    else:
        print(
            f"{prefix}: {stats['documents']:,} documents, {stats['sequences']:,} sequences, "
            f"{stats['tokens']:,} tokens ({stats['dtype']}, {ds.bin_bytes:,} bytes of .bin)"
        )
        if stats["empty_documents"]:
            print(f"  {stats['empty_documents']:,} documents without tokens")
        print(
            f"  sequence length: min {stats['length_min']:,}, median {stats['length_median']:,.0f}, "
            f"mean {stats['length_mean']:,.1f}, max {stats['length_max']:,}"
        )
        width = max((c for _, _, c in histogram(lengths)), default=1)
        for lo, hi, count in histogram(lengths):
            bar = "#" * max(int(40 * count / width), 1 if count else 0)
            print(f"  {lo:>9,}-{hi:<9,} {count:>10,} {bar}")

    status = 0
    if args.verify:
        problems = ds.verify(max_token=tokenizer.vocab_size if tokenizer is not None else None)
        if problems:
            for problem in problems:
                status = fail(problem, ExitCode.ERROR)
        else:
            checked = " and token ids within the vocabulary" if tokenizer is not None else ""
            print(f"verify: OK (header, sizes, pointers, document indices{checked})")
    if args.show and tokenizer is not None and status == 0:
        for doc in range(min(args.show, ds.num_documents)):
            text = tokenizer.detokenize(ds.document_tokens(doc).tolist())
            shown = text if len(text) <= args.max_chars else text[: args.max_chars] + " […]"
            print(f"--- document {doc} ({ds.document_tokens(doc).size:,} tokens) ---\n{shown}")
    return status


if __name__ == "__main__":
    sys.exit(main())
