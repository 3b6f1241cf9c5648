#!/usr/bin/env python3
"""``python tools/train_tokenizer.py``, Megatron-LM's path for ``mcore-train-tokenizer`` (``megatron_ext.cli.train_tokenizer:main``): trains a SentencePiece tokenizer."""

from megatron_ext.cli.train_tokenizer import main

if __name__ == "__main__":
    raise SystemExit(main())
