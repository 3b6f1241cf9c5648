#!/usr/bin/env python3
"""``python tools/convert_checkpoint.py``, Megatron-LM's path for ``mcore-convert-checkpoint`` (``megatron_ext.cli.convert_checkpoint:main``): moves a checkpoint to and from Hugging Face transformers."""

from megatron_ext.cli.convert_checkpoint import main

if __name__ == "__main__":
    raise SystemExit(main())
