#!/usr/bin/env python3
"""``python tools/inspect_dataset.py``, Megatron-LM's path for ``mcore-inspect-dataset`` (``megatron_ext.cli.inspect_dataset:main``): inspects a Megatron indexed dataset."""

from megatron_ext.cli.inspect_dataset import main

if __name__ == "__main__":
    raise SystemExit(main())
