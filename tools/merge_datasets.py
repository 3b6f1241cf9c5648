#!/usr/bin/env python3
"""``python tools/merge_datasets.py``, Megatron-LM's path for ``mcore-merge-datasets`` (``megatron_ext.cli.merge_datasets:main``): merges Megatron indexed datasets into one."""

from megatron_ext.cli.merge_datasets import main

if __name__ == "__main__":
    raise SystemExit(main())
