"""Megatron-LM's ``--tokenizer-type`` names: the ones this project implements (``data/tokenizers.py``), and why the
others are refused. Kept apart from the tokenizers so that parsing flags imports nothing heavy."""

from __future__ import annotations

import argparse

TOKENIZER_TYPES = (
    "SentencePieceTokenizer",
    "GPTSentencePieceTokenizer",
    "Llama2Tokenizer",
    "GPT2BPETokenizer",
    "HuggingFaceTokenizer",
    "TikTokenizer",
    "NullTokenizer",
)


VOCAB_SIZE_TOKENIZERS = ("NullTokenizer", "TikTokenizer")
"""The tokenizer types whose vocabulary ``--vocab-size`` gives."""

VOCAB_FILE_TOKENIZERS = ("GPT2BPETokenizer",)
"""The tokenizer types that read ``--vocab-file`` and ``--merge-file``."""

UNSUPPORTED_TOKENIZER_TYPES: dict[str, str] = {
    "BertWordPieceLowerCase": "a BERT WordPiece vocabulary; this project pretrains GPTs (use GPT2BPETokenizer, "
    "SentencePieceTokenizer or HuggingFaceTokenizer)",
    "BertWordPieceCase": "a BERT WordPiece vocabulary; this project pretrains GPTs (use GPT2BPETokenizer, "
    "SentencePieceTokenizer or HuggingFaceTokenizer)",
    "MultimodalTokenizer": "for multimodal models; this project pretrains text-only GPTs",
    "NullMultimodalTokenizer": "for multimodal models; this project pretrains text-only GPTs",
    "SFTTokenizer": "for supervised fine-tuning's chat templates; this project pretrains",
}
"""Megatron-LM's other ``--tokenizer-type`` names, each with why it is refused and what to use."""


def tokenizer_type_problem(name: str) -> str | None:
    """Why ``--tokenizer-type name`` cannot be used (None: it can)."""
    if name in TOKENIZER_TYPES:
        return None
    why = UNSUPPORTED_TOKENIZER_TYPES.get(
        name, f"not a Megatron-LM tokenizer type (one of {', '.join(TOKENIZER_TYPES)})"
    )
    return f"--tokenizer-type {name}: {why}"


def tokenizer_type_argument(text: str) -> str:
    """An argparse ``type`` for ``--tokenizer-type``: the reason instead of "invalid choice"."""
    problem = tokenizer_type_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem.split(": ", 1)[1])
    return text


TOKENIZER_FIELDS = ("tokenizer_type", "tokenizer_model", "vocab_file", "merge_file")
"""The data flags that name the tokenizer (the tools that open a checkpoint take them from it unless given)."""
