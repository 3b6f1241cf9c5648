"""Hugging Face ``transformers`` conversion: which models convert, one rule per tensor, tokenizer files,
export and import (``tools/convert_checkpoint.py``)."""
