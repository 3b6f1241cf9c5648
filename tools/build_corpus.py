#!/usr/bin/env python3
"""Build a real-text JSON Lines corpus from text already on this machine. (entry point: megatron_ext/cli/build_corpus.py; `--help` for the flags)."""

import sys

from megatron_ext.cli.build_corpus import main

if __name__ == "__main__":
    sys.exit(main())
