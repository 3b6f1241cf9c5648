#!/usr/bin/env python3
"""``python tools/build_corpus.py``, Megatron-LM's path for ``mcore-build-corpus`` (``megatron_ext.cli.build_corpus:main``): builds a real-text JSON Lines corpus from text already on this machine."""

from megatron_ext.cli.build_corpus import main

if __name__ == "__main__":
    raise SystemExit(main())
