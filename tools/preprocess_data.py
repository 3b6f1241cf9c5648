#!/usr/bin/env python3
"""JSON Lines → Megatron indexed dataset (``PREFIX_KEY_document.bin/.idx``). (entry point: megatron_ext/cli/preprocess_data.py; `--help` for the flags)."""

import sys

from megatron_ext.cli.preprocess_data import main

if __name__ == "__main__":
    sys.exit(main())
