"""Merge Megatron indexed datasets into one, in the order given.

The result is byte-identical to Megatron-Core's ``IndexedDatasetBuilder.add_index``
over the same inputs (and so to Megatron-LM's ``tools/merge_datasets.py``).
All inputs must store the same token dtype (the same tokenizer); the index
arrays are streamed, so memory stays flat. Every input is verified before
anything is written (as ``tools/inspect_dataset.py --verify``: a ``.bin``
shorter or longer than its index needs is named), and the output appears only
when complete. Exit codes: 0 merged, 1 a bad input or an output the filesystem
refused (full, read-only, not permitted), 2 bad options::

    python tools/merge_datasets.py --input data/a_text_document data/b_text_document \\
        --output-prefix data/ab_text_document
    python tools/merge_datasets.py --input data/shards --output-prefix data/all_text_document

``--write-blend FILE`` writes a blend of the inputs instead, for ``pretrain_gpt.py
--data-args-path FILE`` (Megatron-LM's form): each dataset weighted by its
tokens, or with ``--mix web:0.7 code:0.3`` each source (datasets whose prefix
matches the pattern: a glob, or a word anywhere in it) given its share of the
total, spread over its datasets by tokens::

    python tools/merge_datasets.py --input data/shards --write-blend data/blend.txt --mix web:0.7 code:0.3
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from megatron_ext.config.exit_codes import ExitCode, fail
from megatron_ext.config.flags import Parser
from megatron_ext.data.atomic_files import WriteError
from megatron_ext.data.indexed import IndexedDatasetError, merge_datasets


def prefixes_of(inputs: list[str]) -> list[str]:
    """Prefixes as given; a directory stands for every ``*.idx`` in it, sorted (Megatron-LM's form)."""
    out: list[str] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found = sorted(str(p.with_suffix("")) for p in path.glob("*.idx"))
            if not found:
                raise IndexedDatasetError(f"{path} holds no .idx files")
            out.extend(found)
        else:
            out.append(item[:-4] if item.endswith((".bin", ".idx")) else item)
    return out


def main(argv: list[str] | None = None) -> int:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", nargs="+", required=True, help="Dataset prefixes, or directories of them.")
    out = p.add_mutually_exclusive_group(required=True)
    out.add_argument("--output-prefix", help="Prefix of the merged .bin/.idx.")
    out.add_argument("--write-blend", metavar="FILE", help="Write a blend of the inputs for --data-args-path instead.")
    p.add_argument(
        "--mix", nargs="+", default=[], metavar="PATTERN:SHARE", help="With --write-blend: shares by source."
    )
    args = p.parse_args(argv)
    if args.mix and not args.write_blend:
        p.error("--mix goes with --write-blend")
    if args.write_blend:
        return _write_blend(args.input, args.write_blend, args.mix)
    try:
        prefixes = prefixes_of(args.input)
        if args.output_prefix in prefixes:
            raise IndexedDatasetError(f"--output-prefix {args.output_prefix} is also an input")
        writer = merge_datasets(prefixes, args.output_prefix)
    except (IndexedDatasetError, WriteError) as exc:
        return fail(exc, ExitCode.ERROR)
    print(
        f"merged {len(prefixes)} datasets into {args.output_prefix}: {writer.num_documents:,} documents, "
        f"{writer.num_sequences:,} sequences, {writer.num_tokens:,} tokens ({writer.dtype})"
    )
    return ExitCode.OK


def _write_blend(inputs: list[str], path: str, mix: list[str]) -> int:
    from megatron_ext.data.blend_files import parse_mix, plan_blend, write_blend
    from megatron_ext.data.sources import DataError

    try:
        entries = plan_blend(prefixes_of(inputs), parse_mix(mix))
        write_blend(entries, path)
    except (IndexedDatasetError, DataError, WriteError) as exc:
        return fail(exc, ExitCode.ERROR)
    tokens = sum(e.tokens for e in entries)
    print(
        f"wrote {path}: {len(entries):,} datasets, {sum(e.documents for e in entries):,} documents, {tokens:,} tokens"
    )
    total = sum(e.weight for e in entries)
    for source in dict.fromkeys(e.source for e in entries if e.source is not None):
        part = [e for e in entries if e.source == source]
        print(
            f"  {source}: {len(part):,} datasets, {sum(e.tokens for e in part):,} tokens, "
            f"{sum(e.weight for e in part) / total:.1%} of the blend"
        )
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
