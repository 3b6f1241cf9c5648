"""What ``--data-path`` and the tokenizer flags name, checked before anything starts.

``preflight.preflight`` calls :func:`resolve` on every rank, so that a wrong prefix, a
missing ``.bin``/``.idx``, a truncated file or a dataset made with another
tokenizer is a configuration error (exit code 2, one line per problem)
instead of a traceback from every rank after the model has been built.

What each rank reads, per dataset:

* every rank: the ``.idx`` header, its size against its counts, the first and
  last document index and the last sequence's pointer and length against the
  ``.bin`` size (:meth:`~megatron_ext.data.indexed.IndexedDatasetFiles.quick_check`):
  O(1), a few hundred bytes, whatever the size of the dataset or the number of
  ranks on a shared filesystem;
* global rank 0 only (environment ``RANK``, default 0, so also
  ``pretrain_gpt.py --dry-run`` and any single-process run): in addition every
  pointer and document index (:meth:`~megatron_ext.data.indexed.IndexedDatasetFiles.verify`,
  O(number of sequences)) and a sample of ``_SAMPLE_TOKENS`` tokens from the
  start and from the end of the ``.bin`` against the vocabulary (up to 2 × 8 MB
  read for uint16 tokens). A problem found there stops rank 0 with exit code 2
  before any process group exists; the launcher (torchrun) then ends the other
  ranks. The recipes also run ``--dry-run`` (rank 0's checks) before launching.

``tools/inspect_dataset.py --verify`` checks every element and, with a
tokenizer, every token.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from megatron_ext.data.indexed import IndexedDatasetError, IndexedDatasetFiles, bin_path, optimal_dtype
from megatron_ext.data.tokenizer_base import Tokenizer, TokenizerError
from megatron_ext.data.tokenizers import build_tokenizer

_SAMPLE_TOKENS = 4 << 20


class DataError(ValueError):
    """Training data or tokenizer options that cannot work together."""


@dataclass(frozen=True)
class Blend:
    """Dataset prefixes and their weights (None: proportional to size, as Megatron)."""

    prefixes: tuple[str, ...]
    weights: tuple[float, ...] | None

    def as_megatron(self) -> tuple[list[str], list[float] | None]:
        """The ``blend`` tuple of Megatron-Core's ``BlendedMegatronDatasetConfig``."""
        return list(self.prefixes), list(self.weights) if self.weights is not None else None


def _as_weight(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def parse_blend(items: Sequence[str], flag: str = "--data-path") -> Blend:
    """Megatron-LM's forms: ``PREFIX [PREFIX ...]`` or ``W1 PREFIX1 W2 PREFIX2 ...``."""
    items = list(items)
    if not items:
        raise DataError(f"{flag} is empty")
    if len(items) % 2 == 0:
        weights = [_as_weight(w) for w in items[0::2]]
        prefixes = items[1::2]
        if all(w is not None for w in weights):
            bad = [w for w in weights if w is None or w < 0]
            if bad or sum(w for w in weights if w is not None) <= 0:
                raise DataError(f"{flag}: weights must be non-negative and not all zero, got {items[0::2]}")
            if any(_as_weight(p) is not None for p in prefixes):
                raise DataError(f"{flag}: expected 'W1 PREFIX1 W2 PREFIX2 ...', got {' '.join(items)}")
            return Blend(tuple(prefixes), tuple(float(w) for w in weights if w is not None))
        if any(w is not None for w in weights):
            raise DataError(
                f"{flag}: mixes weights and prefixes ({' '.join(items)}); give either 'PREFIX ...' or "
                "'W1 PREFIX1 W2 PREFIX2 ...'"
            )
    elif any(_as_weight(p) is not None for p in items):
        raise DataError(
            f"{flag}: an odd number of items with a number among them ({' '.join(items)}): a weight without its prefix?"
        )
    return Blend(tuple(items), None)


def tokenizer_for(data: Any, *, vocab_size: int | None) -> Tokenizer:
    """The tokenizer named by the data flags (``DataArgs``) and ``--vocab-size``."""
    try:
        return build_tokenizer(
            data.tokenizer_type,
            tokenizer_model=data.tokenizer_model,
            vocab_file=data.vocab_file,
            merge_file=data.merge_file,
            vocab_size=vocab_size,
            tiktoken_pattern=data.tiktoken_pattern,
            tiktoken_num_special_tokens=data.tiktoken_num_special_tokens,
            special_tokens=data.tokenizer_special_tokens,
            null_tokenizer_eod_id=getattr(data, "null_tokenizer_eod_id", None),
            null_tokenizer_pad_id=getattr(data, "null_tokenizer_pad_id", -1),
        )
    except TokenizerError as exc:
        raise DataError(str(exc)) from exc


def blends(data: Any) -> dict[str, Blend | None]:
    """``{"data": blend}`` for ``--data-path``, else one blend per split (None where not given)."""
    if data.data_path:
        return {"data": parse_blend(data.data_path)}
    return {
        split: parse_blend(paths, f"--{split}-data-path") if paths else None
        for split, paths in (
            ("train", data.train_data_path),
            ("valid", data.valid_data_path),
            ("test", data.test_data_path),
        )
    }


def _full_checks_here() -> bool:
    """True on global rank 0 (``RANK``, default 0): the rank that does the O(#sequences) checks."""
    try:
        return int(os.environ.get("RANK", "0")) == 0
    except ValueError:
        return True


def _can_hold(dtype: np.dtype, vocab_size: int) -> bool:
    """Whether every id in ``[0, vocab_size)`` fits in ``dtype`` (an integer type)."""
    return dtype.kind in "iu" and int(np.iinfo(dtype).max) >= vocab_size - 1


def check_dataset(prefix: str, tokenizer: Tokenizer, *, full: bool | None = None) -> IndexedDatasetFiles:
    """Raise :class:`DataError` if ``prefix`` is missing, damaged, or made with another tokenizer.

    ``full`` (default: on global rank 0 only) adds the O(#sequences) index
    verification and the token sample; otherwise only O(1) checks are made.
    """
    if full is None:
        full = _full_checks_here()
    try:
        files = IndexedDatasetFiles.open(prefix)
    except IndexedDatasetError as exc:
        raise DataError(str(exc)) from exc
    problems = files.quick_check()
    if not problems and full:
        problems = files.verify()
    if problems:
        raise DataError(f"dataset {prefix}: {problems[0]}")
    if files.num_sequences == 0:
        raise DataError(f"dataset {prefix} holds no tokens")
    # Any integer dtype that holds the vocabulary is valid (e.g. int32 for a small vocabulary, as other
    # tools write); this tokenizer would itself write optimal_dtype(vocab_size).
    if not _can_hold(files.dtype, tokenizer.vocab_size):
        raise DataError(
            f"dataset {prefix} stores {files.dtype} tokens, which cannot hold the ids of {tokenizer.describe()} "
            f"(up to {tokenizer.vocab_size - 1:,}): it was made with a different tokenizer; preprocess it again "
            f"with this one (it writes {np.dtype(optimal_dtype(tokenizer.vocab_size))}), or pass the tokenizer it "
            "was made with"
        )
    if full:
        data = np.memmap(bin_path(prefix), mode="r", dtype=files.dtype)
        for sample in (data[:_SAMPLE_TOKENS], data[-_SAMPLE_TOKENS:]):
            if sample.size and (int(sample.max()) >= tokenizer.vocab_size or int(sample.min()) < 0):
                bad = int(sample.max()) if int(sample.max()) >= tokenizer.vocab_size else int(sample.min())
                raise DataError(
                    f"dataset {prefix} holds token id {bad}, beyond the vocabulary of {tokenizer.describe()}: "
                    "it was made with a different tokenizer"
                )
    return files


def resolve(data: Any, *, vocab_size: int | None, full: bool | None = None) -> Tokenizer:
    """Build the tokenizer and check every dataset against it; return the tokenizer.

    ``full``: see :func:`check_dataset` (default: full checks on global rank 0 only).
    """
    if data.tokenizer_type == "NullTokenizer" and vocab_size is None:
        raise DataError("--tokenizer-type NullTokenizer needs --vocab-size N")
    # As in Megatron-LM, --vocab-size only sizes the NullTokenizer; other tokenizers bring their own.
    tokenizer = tokenizer_for(data, vocab_size=vocab_size)
    if not data.mock_data:
        for blend in blends(data).values():
            for prefix in blend.prefixes if blend is not None else ():
                check_dataset(prefix, tokenizer, full=full)
    return tokenizer


OPEN_FILES_PER_DATASET = {True: 3, False: 1}
"""Files Megatron-Core keeps open for each dataset of a blend, with and without ``.bin`` memory maps (the
``.idx`` and ``.bin`` maps and a handle, or the ``.idx`` map alone), beside ``OPEN_FILES_PER_SPLIT``."""
OPEN_FILES_PER_SPLIT = 3
"""And for each split a dataset serves, read from the cache: its document, sample and shuffle index maps.
Measured with ``bench/blend_build_bench.py``: 12 open files per dataset of a 3-split blend, 10 with
``--no-mmap-bin-files`` (a first, uncached build holds 3 and 1)."""
SPARE_FILES = 512
"""For everything else a rank opens: libraries, sockets of the process groups, checkpoint files, logs."""


def open_files_needed(datasets: int, dataset_splits: int, *, mmap: bool) -> int:
    """Open files a rank needs for ``datasets`` datasets serving ``dataset_splits`` (dataset, split) pairs."""
    return datasets * OPEN_FILES_PER_DATASET[mmap] + dataset_splits * OPEN_FILES_PER_SPLIT + SPARE_FILES


def allow_open_files(datasets: int, dataset_splits: int, *, mmap: bool) -> None:
    """Raise this process's soft limit on open files (``ulimit -n``) as far as the blend needs, up to the hard
    limit; DataError when even the hard limit is too low, with the fixes. A blend of thousands of shards otherwise
    fails inside Megatron-Core's dataset builder with "Too many open files"."""
    import resource

    needed = open_files_needed(datasets, dataset_splits, mmap=mmap)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        fewer = open_files_needed(datasets, dataset_splits, mmap=False)
        raise DataError(
            f"the data has {datasets:,} datasets and Megatron-Core keeps {OPEN_FILES_PER_DATASET[mmap]} files open for "
            f"each, and {OPEN_FILES_PER_SPLIT} more for each split it serves: about {needed:,}, over this process's "
            f"hard limit of {hard:,} (ulimit -Hn). Raise the limit (limits.conf, the cluster's settings)"
            + (f", or pass --no-mmap-bin-files ({fewer:,})" if mmap else "")
            + ", or merge shards into fewer datasets (tools/merge_datasets.py)"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed if hard == resource.RLIM_INFINITY else hard, hard))
