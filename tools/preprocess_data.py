#!/usr/bin/env python3
"""``python tools/preprocess_data.py``, Megatron-LM's path for ``mcore-preprocess-data`` (``megatron_ext.cli.preprocess_data:main``): JSON Lines, Parquet or Arrow to a Megatron indexed dataset."""

from megatron_ext.cli.preprocess_data import main

if __name__ == "__main__":
    raise SystemExit(main())
