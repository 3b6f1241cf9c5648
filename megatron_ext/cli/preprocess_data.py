"""JSON Lines (plain, gzip, zstd), Parquet or Arrow → Megatron indexed dataset (``PREFIX_KEY_document.bin/.idx``).

A drop-in for Megatron-LM's ``tools/preprocess_data.py`` for GPT data (its
flags except sentence splitting, the worker-count search and the options of
tokenizers not implemented here, see docs/data.md; the same output bytes) that
needs only ``megatron.core``, streams in bounded memory, reports bad lines with
file and line number, and leaves nothing at the output paths unless it
finishes. Exit codes: 0 done, 1 bad input, a failed worker or an output the
filesystem refused (full, read-only, not permitted: one line naming the file and
the fix), 2 bad options, 128 + N when stopped by signal N (130 Ctrl-C, 143 SIGTERM)::

    python tools/preprocess_data.py --input 'corpus/*.jsonl.zst' --output-prefix data/corpus \\
        --tokenizer-type GPTSentencePieceTokenizer --tokenizer-model tok.model --append-eod --workers 8
    python tools/preprocess_data.py --input 'fineweb/data/*/*.parquet' --output-prefix data/fineweb \\
        --output-per-file --tokenizer-type GPTSentencePieceTokenizer --tokenizer-model tok.model --append-eod
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from megatron_ext.config.exit_codes import SIGNAL_BASE, ExitCode, fail
from megatron_ext.config.flags import Parser, above, at_least
from megatron_ext.config.tokenizer_types import TOKENIZER_TYPES, tokenizer_type_argument
from megatron_ext.data import formats, preprocess
from megatron_ext.data.atomic_files import WriteError
from megatron_ext.data.preprocess_worker import TokenizerSpec
from megatron_ext.data.tokenizer_base import TokenizerError


def build_parser() -> argparse.ArgumentParser:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("input data")
    g.add_argument(
        "--input",
        nargs="+",
        required=True,
        help="Files, globs (sorted) or datasets.save_to_disk directories. The format follows the name: .jsonl/.json "
        "(JSON Lines), .gz, .zst, .parquet, .arrow; see --input-format.",
    )
    g.add_argument(
        "--input-format",
        choices=formats.FORMATS,
        help="Read every input as this format, whatever its name (default: each file's name says).",
    )
    g.add_argument(
        "--json-keys",
        nargs="+",
        default=["text"],
        help="JSON keys, or Parquet/Arrow string columns, to extract; one dataset per key.",
    )
    g.add_argument("--split-sentences", action="store_true", help="Not supported (needs NLTK); refused.")
    g.add_argument("--keep-newlines", action="store_true", help="Only with --split-sentences; refused.")
    g = p.add_argument_group("tokenizer")
    g.add_argument(
        "--tokenizer-type",
        required=True,
        type=tokenizer_type_argument,
        metavar="{" + ",".join(TOKENIZER_TYPES) + "}",
        help="Megatron-LM tokenizer name.",
    )
    g.add_argument("--tokenizer-model", help="SentencePiece .model file, or a local Hugging Face directory.")
    g.add_argument("--vocab-file", help="GPT2BPETokenizer: vocab.json.")
    g.add_argument("--merge-file", help="GPT2BPETokenizer: merges.txt.")
    g.add_argument(
        "--vocab-size",
        type=at_least(1),
        help="NullTokenizer: number of ids, end of document included (eod is this number - 1, as Megatron-LM 0.17 "
        "and later); TikTokenizer: the vocabulary (default 131072).",
    )
    g.add_argument("--tiktoken-pattern", choices=["v1", "v2"], help="TikTokenizer: Megatron-LM's pattern.")
    g.add_argument(
        "--tiktoken-num-special-tokens", type=at_least(1), default=1000, help="TikTokenizer: ids before the ranks."
    )
    g.add_argument(
        "--tokenizer-special-tokens",
        "--tiktoken-special-tokens",
        nargs="+",
        help="TikTokenizer: the special tokens (must include <unk> <s> </s>, the default).",
    )
    g.add_argument("--append-eod", action="store_true", help="Append the end-of-document id to every document.")
    g.add_argument("--lang", default="english", help="Accepted for compatibility (sentence splitting only).")
    g = p.add_argument_group("output data")
    g.add_argument("--output-prefix", required=True, help="Output path without _KEY_document.bin/.idx.")
    g.add_argument(
        "--output-per-file",
        action="store_true",
        help="One dataset per input file and key: PREFIX_NAME_KEY_document, NAME being the file's path below the "
        "inputs' common directory without its suffixes, '/' as '_' (default: one dataset for all inputs).",
    )
    g.add_argument(
        "--input-root",
        help="With --output-per-file: NAME is the path below this directory instead, so that runs over parts of "
        "one corpus (the tasks of recipes/preprocess_corpus.sh) name its files alike.",
    )
    g = p.add_argument_group("runtime")
    g.add_argument(
        "--workers",
        type=at_least(1),
        default=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1,
        help="Worker processes that parse and tokenize (default: the CPUs available).",
    )
    g.add_argument(
        "--partitions",
        type=at_least(1),
        default=1,
        help="Accepted for compatibility, with no effect: every worker takes chunks of every file and input order "
        "is always kept, so the output is the same for any value (no --workers rule either).",
    )
    g.add_argument("--keep-sequential-samples", action="store_true", help="Accepted; order is always kept.")
    g.add_argument(
        "--log-interval", type=at_least(1), default=1000, help="Documents between progress lines (no terminal)."
    )
    g.add_argument("--quiet", action="store_true", help="No progress output.")
    g.add_argument(
        "--skip-bad-lines",
        action="store_true",
        help="Skip lines (rows) that are not JSON objects, lack a key, hold a non-string, a null or invalid UTF-8; "
        "count them per reason (default: stop at the first one and write nothing).",
    )
    g.add_argument(
        "--allow-empty-output",
        action="store_true",
        help="Write empty datasets when no document has a token (default: an error, nothing written).",
    )
    g.add_argument(
        "--chunk-mb", type=above(0), default=1.0, help="Input read per task, in MB of text (whole lines or rows)."
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.split_sentences or args.keep_newlines:
        return fail(
            "--split-sentences/--keep-newlines are not supported (GPT pretraining uses documents)", ExitCode.INVALID
        )
    if args.input_root is not None and not args.output_per_file:
        return fail("--input-root names the datasets of --output-per-file; give both or neither", ExitCode.INVALID)
    spec = TokenizerSpec(
        tokenizer_type=args.tokenizer_type,
        tokenizer_model=args.tokenizer_model,
        vocab_file=args.vocab_file,
        merge_file=args.merge_file,
        vocab_size=args.vocab_size,
        tiktoken_pattern=args.tiktoken_pattern,
        tiktoken_num_special_tokens=args.tiktoken_num_special_tokens,
        special_tokens=tuple(args.tokenizer_special_tokens) if args.tokenizer_special_tokens else None,
    )
    opts = preprocess.Options(
        inputs=tuple(args.input),
        output_prefix=args.output_prefix,
        json_keys=tuple(args.json_keys),
        append_eod=args.append_eod,
        workers=args.workers,
        skip_bad_lines=args.skip_bad_lines,
        chunk_bytes=max(int(args.chunk_mb * (1 << 20)), 4096),
        log_interval=args.log_interval,
        quiet=args.quiet,
        allow_empty=args.allow_empty_output,
        input_format=args.input_format,
        output_per_file=args.output_per_file,
        input_root=args.input_root,
    )
    report = preprocess.report_path(args.output_prefix)
    try:
        summary = preprocess.run(spec, opts, report)
    except (formats.InputError, TokenizerError, WriteError) as exc:
        # A refused write is a run-time failure like bad input (1), not a bad option (2), and not worth
        # retrying as is (75 would make the recipes requeue into the same full or read-only disk).
        return fail(exc, ExitCode.ERROR)
    except KeyboardInterrupt as exc:
        # The shell's convention: 128 + the signal (130 for Ctrl-C/SIGINT, 143 for SIGTERM, 129 for SIGHUP).
        signum = getattr(exc, "signum", signal.SIGINT)
        if getattr(exc, "published", False):
            print(
                f"\ninterrupted ({exc or 'Ctrl-C'}) while the finished outputs were being named; they are complete "
                f"and were kept (under {args.output_prefix}), the report was not written",
                file=sys.stderr,
            )
        else:
            print(f"\ninterrupted ({exc or 'Ctrl-C'}): nothing was written", file=sys.stderr)
        return SIGNAL_BASE + int(signum)
    if not args.quiet:
        s = summary
        rate = s.input_bytes / max(s.seconds, 1e-9) / 1e6
        print(
            f"done: {s.documents:,} documents, {sum(s.tokens.values()):,} tokens, {s.input_bytes / 1e6:,.1f} MB "
            f"in {s.seconds:.1f} s ({rate:.1f} MB/s, {s.documents / max(s.seconds, 1e-9):,.0f} docs/s)",
            file=sys.stderr,
        )
        if args.output_per_file:
            first = next(iter(s.outputs.values()))
            print(f"  {len(s.outputs):,} datasets ({first}.bin / .idx, …; all in {report})", file=sys.stderr)
        else:
            for key, prefix in s.outputs.items():
                print(f"  {key}: {prefix}.bin / .idx ({s.tokens[key]:,} tokens)", file=sys.stderr)
        if any(s.empty_documents.values()):
            print(f"  empty documents (no tokens, skipped): {s.empty_documents}", file=sys.stderr)
        if any(s.skipped.values()):
            counts = ", ".join(f"{r}: {n:,}" for r, n in s.skipped.items() if n)
            print(f"  skipped bad records: {counts} (see {report})", file=sys.stderr)
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
