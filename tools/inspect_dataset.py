#!/usr/bin/env python3
"""Inspect a Megatron indexed dataset: counts, length histogram, decoded documents, integrity. (entry point: megatron_ext/cli/inspect_dataset.py; `--help` for the flags)."""

import sys

from megatron_ext.cli.inspect_dataset import main

if __name__ == "__main__":
    sys.exit(main())
