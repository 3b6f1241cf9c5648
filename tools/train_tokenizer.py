#!/usr/bin/env python3
"""Train a SentencePiece tokenizer (BPE or unigram) on JSON Lines, in bounded memory. (entry point: megatron_ext/cli/train_tokenizer.py; `--help` for the flags)."""

import sys

from megatron_ext.cli.train_tokenizer import main

if __name__ == "__main__":
    sys.exit(main())
