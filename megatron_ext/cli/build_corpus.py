"""Build a real-text JSON Lines corpus from text already on this machine.

Python docstrings (standard library, then installed packages) and
``/usr/share/doc``; nothing is downloaded and nothing is stored in the
repository::

    python tools/build_corpus.py --output runs/corpus/stdlib.jsonl --target-mb 4 --sources stdlib
"""

from __future__ import annotations

import argparse
import sys
import time

from megatron_ext.config.exit_codes import ExitCode
from megatron_ext.config.flags import Parser, above, at_least
from megatron_ext.data.local_corpus import SOURCES, build_corpus


def main(argv: list[str] | None = None) -> int:
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output", required=True, help="JSON Lines file to write.")
    p.add_argument("--target-mb", type=above(0), default=4.0, help="Stop once this many MB are written.")
    p.add_argument("--sources", nargs="+", default=list(SOURCES), choices=SOURCES, help="Where text comes from.")
    p.add_argument("--workers", type=at_least(1), default=2, help="Processes that parse files.")
    args = p.parse_args(argv)
    start = time.perf_counter()
    counts = build_corpus(args.output, target_mb=args.target_mb, sources=tuple(args.sources), workers=args.workers)
    size = counts.pop("bytes")
    docs = ", ".join(f"{n:,} from {s}" for s, n in counts.items())
    print(f"wrote {args.output}: {size / 1e6:.1f} MB, {docs} ({time.perf_counter() - start:.1f} s)")
    if size < args.target_mb * 1e6 * 0.5:
        print(f"note: only {size / 1e6:.1f} MB of text found for --target-mb {args.target_mb}", file=sys.stderr)
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
