#!/usr/bin/env python3
"""``python tools/generate.py``, Megatron-LM's path for ``mcore-generate`` (``megatron_ext.cli.generate:main``): generates text from a checkpoint saved under any layout."""

from megatron_ext.cli.generate import main

if __name__ == "__main__":
    raise SystemExit(main())
