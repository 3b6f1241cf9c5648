#!/usr/bin/env python3
"""``python tools/layout.py``, Megatron-LM's path for ``mcore-layout`` (``megatron_ext.cli.layout:main``): the 3D-parallel layout calculator."""

from megatron_ext.cli.layout import main

if __name__ == "__main__":
    raise SystemExit(main())
