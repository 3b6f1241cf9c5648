"""The data group of ``pretrain_gpt.py``'s flags (``DataArgs``: datasets, blends, split, tokenizer) and the
``--split`` reader; the other groups are in ``arguments.py``, ``optimizer_args.py`` and ``run_args.py``."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from megatron_ext.config.arguments import ConfigError, _Options
from megatron_ext.config.fim_args import FimArgs
from megatron_ext.config.flags import opt
from megatron_ext.config.tokenizer_types import TOKENIZER_TYPES, VOCAB_FILE_TOKENIZERS, tokenizer_type_problem

_SPLIT_SEPARATOR = re.compile(r"\s*[,/]\s*|\s+")
_SPLIT_PART = re.compile(r"\+?(?:\d+\.?\d*|\.\d+)")
_SPLIT_EXAMPLE = "give up to three proportions (train, valid, test) separated by ',' or '/', e.g. 969,30,1"


def parse_split(text: str) -> tuple[float, float, float]:
    """Megatron's split string as (train, valid, test) weights, or a one-line ConfigError naming ``--split``.

    Megatron-Core reads the string as every run of digits and dots in it (``parse_and_normalize_split``), fewer
    than three padded with zeros; Megatron-LM's older reader splits on ``,`` or ``/``. Both read plain decimals
    between those separators alike, and so does this. What they would misread is refused: a sign or exponent
    Megatron-Core drops (``100,-5,5`` becomes 100,5,5; ``1e3`` becomes 1,3), a word (``abc``, ``nan``), an empty
    part (``969,,1`` would shift the test share into valid), more than three parts (an assertion there), and
    proportions summing to 0 (a NaN there). Quotes around the whole string (``'99,1,0'``, which launch scripts
    that quote inside their flag arrays pass on) are read past, as Megatron-Core reads past them.
    """
    stripped = text.strip()
    if len(stripped) >= 2 and stripped[0] == stripped[-1] and stripped[0] in "'\"":
        stripped = stripped[1:-1].strip()
    if not stripped:
        raise ConfigError(f"--split is empty; {_SPLIT_EXAMPLE}")
    parts = _SPLIT_SEPARATOR.split(stripped)
    for part in parts:
        if not _SPLIT_PART.fullmatch(part):
            what = "an empty part" if not part else f"{part!r}, which is not a non-negative decimal number"
            raise ConfigError(f"--split {text!r} has {what}; {_SPLIT_EXAMPLE}")
    if len(parts) > 3:
        raise ConfigError(f"--split {text!r} has {len(parts)} parts; {_SPLIT_EXAMPLE}")
    weights = [float(part) for part in parts] + [0.0] * (3 - len(parts))
    if not all(math.isfinite(w) for w in weights):
        raise ConfigError(f"--split {text!r} has a number too large to be a proportion; {_SPLIT_EXAMPLE}")
    if sum(weights) <= 0:
        raise ConfigError(f"--split {text!r} gives every split a share of 0; {_SPLIT_EXAMPLE}")
    train, valid, test = weights
    return train, valid, test


DATALOADER_REFUSALS = {
    "external": "Megatron-LM then hands the dataset itself to the training loop as its iterator, which its own "
    "pretrain_gpt.py cannot train with either; use single",
}
"""Megatron-LM's other ``--dataloader-type`` values and why they are refused."""


@dataclass(frozen=True, kw_only=True)
class DataArgs(FimArgs, _Options):
    """Training data (Megatron indexed datasets, made by tools/preprocess_data.py) and the tokenizer."""

    mock_data: bool = opt(False, "Train on Megatron-Core's mock GPT dataset (no files).")
    data_path: tuple[str, ...] = opt(
        (), "Indexed dataset prefixes (no .bin/.idx), optionally weighted: 'P1 P2 …' or 'W1 P1 W2 P2 …'."
    )
    split: str = opt(
        "969,30,1", "Train/valid/test proportions of --data-path (Megatron's split string).", env="DATA_SPLIT"
    )
    train_data_path: tuple[str, ...] = opt((), "Training blend when the splits come from separate datasets.")
    valid_data_path: tuple[str, ...] = opt((), "Validation blend (with --train-data-path).")
    test_data_path: tuple[str, ...] = opt((), "Test blend (with --train-data-path).")
    data_args_path: str | None = opt(
        None,
        "A file holding --data-path's value (Megatron-LM's): 'W1 P1 W2 P2 …' or 'P1 P2 …', whitespace-separated, "
        "for blends too long for a command line (tools/merge_datasets.py --blend-output writes one).",
    )
    per_split_data_args_path: str | None = opt(
        None,
        "A JSON file with keys train, valid and test, each a list or a string in --data-path's form "
        "(Megatron-LM's): the blends of --train/valid/test-data-path.",
    )
    data_cache_path: str | None = opt(
        None,
        "Where Megatron-Core caches its sample/shuffle indices (default: next to each dataset).",
        env="DATA_CACHE_PATH",
    )
    tokenizer_type: str = opt(
        "NullTokenizer",
        f"Tokenizer, with Megatron-LM's names and semantics (must be the one the data was preprocessed with): "
        f"{', '.join(TOKENIZER_TYPES)}. Default: GPT2BPETokenizer with --vocab-file and --merge-file, else "
        "NullTokenizer.",
        env="TOKENIZER_TYPE",
    )
    tokenizer_model: str | None = opt(
        None, "SentencePiece .model file, or a local Hugging Face tokenizer directory.", env="TOKENIZER_MODEL"
    )
    tiktoken_pattern: str | None = opt(
        None, "TikTokenizer: Megatron-LM's pre-tokenizer pattern, v1 or v2.", choices=["v1", "v2"]
    )
    tiktoken_num_special_tokens: int = opt(
        1000, "TikTokenizer: ids before the vocabulary file's ranks (the special tokens, then fillers).", minimum=1
    )
    tokenizer_special_tokens: tuple[str, ...] | None = opt(
        None, "TikTokenizer: the special tokens (ids 0, 1, ...; must include <unk> <s> </s>, the default)."
    )
    null_tokenizer_eod_id: int | None = opt(
        None,
        "NullTokenizer: the end-of-document id (default --vocab-size - 1, Megatron-LM 0.17 and later; before, an id "
        "added after the vocabulary).",
        minimum=0,
    )
    null_tokenizer_pad_id: int = opt(
        -1, "NullTokenizer: the id GPTDataset pads with (default -1: none, the dataset's own padding)."
    )
    vocab_file: str | None = opt(None, "GPT2BPETokenizer: vocab.json.")
    merge_file: str | None = opt(None, "GPT2BPETokenizer: merges.txt.")
    num_workers: int = opt(0, "Data-loader worker processes.", minimum=0)
    dataloader_type: str | None = opt(
        None,
        "Megatron-LM's loader: single (its default for GPT) reads the samples once in order from the "
        "consumed-samples position; cyclic reads every epoch in a new random order (seeded by the epoch), "
        "each DP rank within its own share unless --no-data-sharding; external is refused with the reason.",
        choices=["single", "cyclic", "external"],
    )
    no_data_sharding: bool = opt(
        False, "With --dataloader-type cyclic: shuffle the whole dataset and deal it out, not each DP rank's share."
    )
    no_mmap_bin_files: bool = opt(False, "Read the .bin files with file reads instead of memory-mapping them.")
    num_dataset_builder_threads: int = opt(1, "Threads that build the blend's datasets (Megatron-Core).", minimum=1)
    mid_level_dataset_surplus: float = opt(
        0.005, "Samples a blend's datasets build beyond their share, as a fraction (Megatron-Core).", minimum=0
    )
    allow_ambiguous_pad_tokens: bool = opt(
        False, "Let the pad id be a token of the vocabulary (Megatron-Core's dataset refuses it otherwise)."
    )
    dataloader_fast_cache_load: bool = opt(
        False, "Load the dataset indices from --data-cache-path without checking the datasets (all cached)."
    )
    dataloader_defer_npy_index_mmap: bool = opt(
        False, "Memory-map the cached dataset indices when first read, not when the datasets are built."
    )
    eod_mask_loss: bool = opt(False, "Leave the end-of-document tokens out of the loss (their loss mask is 0).")
    reset_position_ids: bool = opt(
        False, "Restart position ids at 0 after every end-of-document token (learned absolute positions)."
    )
    reset_attention_mask: bool = opt(
        False,
        "Documents packed into one sequence do not attend to each other: each sample's attention mask (Megatron-"
        "Core's GPTDataset builds it) is causal within each document, restarting after every end-of-document "
        "token. Every pipeline stage reads it. Needs Megatron-Core's own attention (the local spec).",
    )
    no_create_attention_mask_in_dataloader: bool = opt(
        False,
        "Megatron-LM's switch that keeps the dataset from building attention masks: attention is then causal over "
        "the whole sequence, and --reset-attention-mask has no effect (as in Megatron-LM).",
    )

    dataloader_inter_document_masking: bool = opt(
        False,
        "Documents packed into one sequence do not attend to each other, as packed sequences: each sample carries "
        "its documents' boundaries (cu_seqlens, Megatron-Core's GPTDataset), every pipeline stage reads them, and "
        "attention runs per document in the THD form (Transformer Engine's attention, or PyTorch's SDPA with the "
        "local spec); positions, rotary ones included, restart at each document. No mask tensor is built (it "
        "replaces --reset-attention-mask). A fill-in-the-middle sample is one document (as in Megatron-LM).",
    )

    @property
    def document_attention_mask(self) -> bool:
        """Whether each sample carries a per-document attention mask that the model applies (Megatron-LM turns
        the mask off when the boundaries are given as packed sequences)."""
        return (
            self.reset_attention_mask
            and not self.no_create_attention_mask_in_dataloader
            and not self.dataloader_inter_document_masking
        )

    @property
    def reads_every_stage(self) -> bool:
        """Whether every model chunk, the middle ones included, reads each micro-batch: a per-document mask or
        the documents' boundaries are applied in every layer."""
        return self.document_attention_mask or self.dataloader_inter_document_masking

    def packed_documents_problem(self, *, attention_backend: str, cp: int) -> str | None:
        """Why this run cannot attend per packed document (``--dataloader-inter-document-masking``), or None."""
        flag = "--dataloader-inter-document-masking"
        if not self.dataloader_inter_document_masking:
            return None
        if attention_backend == "local":  # Megatron-Core's own attention (the local spec)
            return (
                f"{flag}: Megatron-Core's DotProductAttention (--attention-backend local) does not take packed "
                "sequences; give --attention-backend auto (PyTorch's SDPA, per document) or Transformer Engine"
            )
        if cp > 1:
            # Megatron-LM splits each packed row over the CP ranks as one sequence (per-sequence balancing) while
            # the rotary embedding and Transformer Engine's attention split every document: not run here unchecked.
            return (
                f"{flag} with --context-parallel-size {cp}: splitting packed documents over context-parallel ranks "
                "is not checked here; train with --context-parallel-size 1, or without the flag"
            )
        return None

    def _relations(self) -> None:
        parse_split(self.split)  # raises, naming --split
        if self.dataloader_fast_cache_load and not self.data_cache_path:
            raise ConfigError(
                "--dataloader-fast-cache-load reads the dataset indices from the cache: give --data-cache-path "
                "(as Megatron-Core requires)"
            )
        problem = tokenizer_type_problem(self.tokenizer_type)
        if problem is not None:
            raise ConfigError(problem)
        if self.tokenizer_type == "TikTokenizer" and not (self.tokenizer_model and self.tiktoken_pattern):
            raise ConfigError("--tokenizer-type TikTokenizer needs --tokenizer-model VOCAB.json and --tiktoken-pattern")
        if (self.vocab_file or self.merge_file) and self.tokenizer_type not in VOCAB_FILE_TOKENIZERS:
            raise ConfigError(
                f"--vocab-file/--merge-file are read by {' and '.join(VOCAB_FILE_TOKENIZERS)}, not by "
                f"--tokenizer-type {self.tokenizer_type}; drop them or change the tokenizer type"
            )
        per_split = self.train_data_path or self.valid_data_path or self.test_data_path
        if self.data_path and per_split:
            raise ConfigError("--data-path and --train/valid/test-data-path are mutually exclusive; use one form")
        if per_split and not self.train_data_path:
            raise ConfigError("--valid-data-path/--test-data-path need --train-data-path")
        if self.data_args_path and (self.data_path or per_split or self.per_split_data_args_path):
            raise ConfigError("--data-args-path holds the blend: give it alone, without another data path")
        if self.per_split_data_args_path and (self.data_path or per_split):
            raise ConfigError("--per-split-data-args-path holds the blends: give it without another data path")
        if self.mock_data and (self.data_path or per_split or self.data_args_path or self.per_split_data_args_path):
            raise ConfigError("--mock-data and a data path are mutually exclusive; drop one")
        if self.no_data_sharding and self.dataloader_type != "cyclic":
            raise ConfigError("--no-data-sharding applies to --dataloader-type cyclic only (as in Megatron-LM)")
        if self.dataloader_type in DATALOADER_REFUSALS:
            raise ConfigError(f"--dataloader-type {self.dataloader_type}: {DATALOADER_REFUSALS[self.dataloader_type]}")
        fim = self.fim_problem(mock_data=self.mock_data, tokenizer_type=self.tokenizer_type)
        if fim is not None:
            raise ConfigError(fim)
