#!/usr/bin/env python3
"""Merge Megatron indexed datasets into one, in the order given. (entry point: megatron_ext/cli/merge_datasets.py; `--help` for the flags)."""

import sys

from megatron_ext.cli.merge_datasets import main

if __name__ == "__main__":
    sys.exit(main())
