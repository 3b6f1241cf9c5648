"""The flags of the tools that open a checkpoint in one process (``convert_checkpoint.py to-hf``, ``generate.py``)."""

from __future__ import annotations

import argparse

from megatron_ext.checkpoint import on_disk
from megatron_ext.config.tokenizer_types import TOKENIZER_FIELDS, tokenizer_type_argument


def add_checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    """``--load``, ``--iteration`` and the tokenizer flags that point at another copy of the run's tokenizer."""
    parser.add_argument("--load", required=True, help="The checkpoint directory (pretrain_gpt.py's --save).")
    parser.add_argument("--iteration", type=int, default=None, help="Which checkpoint (default: the latest).")
    group = parser.add_argument_group("tokenizer (default: the one the run recorded in the checkpoint)")
    group.add_argument("--tokenizer-type", type=tokenizer_type_argument, default=None)
    group.add_argument("--tokenizer-model", default=None, help="SentencePiece model or tokenizer directory.")
    group.add_argument("--vocab-file", default=None, help="GPT2BPETokenizer: vocab.json.")
    group.add_argument("--merge-file", default=None, help="GPT2BPETokenizer: merges.txt.")
    group.add_argument(
        "--accept-tokenizer-change",
        action="store_true",
        help="Use a tokenizer other than the one the checkpoint was trained with (it records its SHA-256).",
    )


def tokenizer_overrides(args: argparse.Namespace) -> dict[str, str | None]:
    """The tokenizer flags given (None where not); ``--accept-tokenizer-change`` is not one of them."""
    return {name: getattr(args, name) for name in TOKENIZER_FIELDS}


def checkpoint_error_text(exc: on_disk.CheckpointError, args: argparse.Namespace) -> str:
    """The tool's one line for a checkpoint it cannot use. A damaged latest checkpoint is refused (a tool never
    picks another by itself), and the line names the newest earlier one and how to take it: ``--iteration N``,
    what a resumed training run does by itself (``--no-checkpoint-fallback`` otherwise)."""
    text, load = str(exc), getattr(args, "load", None)
    if load is None or getattr(args, "iteration", None) is not None:
        return text
    try:
        latest = on_disk.read_tracker(load)
    except on_disk.CheckpointError:
        return text
    if latest is None or str(on_disk.checkpoint_dir(load, latest)) not in text:
        return text
    earlier = on_disk.fallback_candidates(load, latest)
    if not earlier:
        return text
    return (
        f"{text}; the newest earlier checkpoint is iteration {earlier[0]}: pass --iteration {earlier[0]} to use it "
        "(a resumed training run falls back to it by itself, unless --no-checkpoint-fallback)"
    )
