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
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from megatron_ext.config.exit_codes import ExitCode
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
    p.add_argument("--output-prefix", required=True, help="Prefix of the merged .bin/.idx.")
    args = p.parse_args(argv)
    try:
        prefixes = prefixes_of(args.input)
        if args.output_prefix in prefixes:
            raise IndexedDatasetError(f"--output-prefix {args.output_prefix} is also an input")
        writer = merge_datasets(prefixes, args.output_prefix)
    except (IndexedDatasetError, WriteError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    print(
        f"merged {len(prefixes)} datasets into {args.output_prefix}: {writer.num_documents:,} documents, "
        f"{writer.num_sequences:,} sequences, {writer.num_tokens:,} tokens ({writer.dtype})"
    )
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
