"""The checks of a run's data before anything starts: its tokenizer, built once, and every dataset against it.

Building a ``TrainingConfig`` is pure (``config.arguments``); this is the step
that opens files. ``pretrain_gpt.py`` calls it for ``--dry-run`` and before a
real run, on every rank before any process group exists, so a wrong path, a
damaged dataset or one made with another tokenizer is one clear
configuration error (exit code 2). What each rank reads: ``sources.py``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass

from megatron_ext.config import iterations
from megatron_ext.config.arguments import ConfigError
from megatron_ext.config.data_args import parse_split
from megatron_ext.config.tokenizer_types import VOCAB_SIZE_TOKENIZERS
from megatron_ext.config.training_config import TrainingConfig
from megatron_ext.data import sources
from megatron_ext.data.blend_files import with_blend_files
from megatron_ext.data.indexed import IndexedDatasetFiles
from megatron_ext.data.tokenizer_base import Tokenizer


@dataclass(frozen=True)
class Checked:
    """A configuration whose data was checked, with the tokenizer that checked it."""

    cfg: TrainingConfig
    """The configuration with the tokenizer's vocabulary filled in (``tokenizer_vocab_size``)."""
    tokenizer: Tokenizer
    """The run's tokenizer (the datasets were checked against it; the data loaders use it)."""


def preflight(cfg: TrainingConfig, *, full: bool) -> Checked:
    """Read the blend files, build the tokenizer and check every dataset of ``cfg`` against it; ConfigError names
    a problem. The returned config holds the blends the files held.

    ``full``: the O(number of sequences) checks as well as the O(1) ones (one
    process per job affords them: ``--dry-run``, global rank 0).
    """
    if cfg.run.tensorboard_dir and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError("--tensorboard-dir needs the tensorboard package: pip install tensorboard")
    null = cfg.data.tokenizer_type in VOCAB_SIZE_TOKENIZERS
    blend_file = cfg.data.data_args_path or cfg.data.per_split_data_args_path
    try:
        cfg = dataclasses.replace(cfg, data=with_blend_files(cfg.data))
        tokenizer = sources.resolve(cfg.data, vocab_size=cfg.model.vocab_size if null else None, full=full)
    except sources.DataError as exc:
        text = str(exc) if blend_file is None or blend_file in str(exc) else f"{exc} (a dataset of {blend_file})"
        raise ConfigError(text) from exc
    fim = fim_token_problem(cfg, tokenizer)
    if fim is not None:
        raise ConfigError(fim)
    problems = empty_split_problems(cfg)
    if problems:
        raise ConfigError("; ".join(problems))
    datasets, dataset_splits = dataset_counts(cfg)
    try:
        sources.allow_open_files(datasets, dataset_splits, mmap=not cfg.data.no_mmap_bin_files)
    except sources.DataError as exc:
        raise ConfigError(str(exc)) from exc
    return Checked(cfg=dataclasses.replace(cfg, tokenizer_vocab_size=tokenizer.vocab_size), tokenizer=tokenizer)


def dataset_counts(cfg: TrainingConfig) -> tuple[int, int]:
    """The datasets Megatron-Core opens, and the (dataset, split) pairs it builds indices for: every occurrence
    of a prefix (one repeated is opened again), every split with a share of ``--split`` or a blend of its own
    (built even when the run reads none of its samples)."""
    if cfg.data.mock_data:
        return 0, 0
    counts = {name: len(blend.prefixes) for name, blend in sources.blends(cfg.data).items() if blend is not None}
    if "data" in counts:  # one blend, split by --split
        return counts["data"], counts["data"] * sum(1 for share in parse_split(cfg.data.split) if share > 0)
    return sum(counts.values()), sum(counts.values())


def empty_split_problems(cfg: TrainingConfig) -> list[str]:
    """The splits the run reads that ``--split`` leaves without a document of a dataset of ``--data-path``.

    Megatron-Core splits each dataset by documents (``round(share × documents)``
    at both ends); indexing an empty split that is asked for samples never ends.
    """
    if cfg.data.mock_data or not cfg.data.data_path:
        return []
    from megatron.core.datasets.blended_megatron_dataset_config import (
        convert_split_vector_to_split_matrix,
        parse_and_normalize_split,
    )

    matrix = convert_split_vector_to_split_matrix(parse_and_normalize_split(cfg.data.split))
    needed = iterations.split_samples(cfg.run, cfg.batch, cfg.layout)
    empty: dict[str, list[tuple[str, int, float]]] = {"train": [], "valid": [], "test": []}
    for prefix in sources.parse_blend(cfg.data.data_path).prefixes:
        documents = IndexedDatasetFiles.open(prefix).num_documents
        for name, part, size in zip(("train", "valid", "test"), matrix, needed, strict=True):
            if size and part is not None and round(part[1] * documents) <= round(part[0] * documents):
                empty[name].append((prefix, documents, part[1] - part[0]))  # Megatron-Core's rounding, above
    problems = []
    for name, found in empty.items():
        if not found:
            continue
        prefix, documents, share = found[0]
        instead = "" if name == "train" else " (or --eval-iters 0)"
        # A blend of thousands of small shards: one line for all of them, the first named.
        others = f" (and the same split of {len(found) - 1:,} more datasets)" if len(found) > 1 else ""
        problems.append(
            f"the {name} split of {prefix} holds no document{others}: --split {cfg.data.split} gives it "
            f"{share:.2%} of its {documents:,} documents; give it a larger share{instead}"
        )
    return problems


def fim_token_problem(cfg: TrainingConfig, tokenizer: Tokenizer) -> str | None:
    """With --fim-data: the first sentinel (or --fim-split-sample) that is not one token of the tokenizer, named
    with its flag and the fix; Megatron-LM would take the unknown token's id and train on it."""
    if not cfg.data.fim_data:
        return None
    named = {f"--fim-{role}-token": token for role, token in cfg.data.fim_tokens.items()}
    if cfg.data.fim_split_sample is not None:
        named["--fim-split-sample"] = cfg.data.fim_split_sample
    token_id = getattr(tokenizer, "token_id", None)
    for flag, token in named.items():
        if token_id is None or token_id(token) is None:
            return (
                f"{flag} {token!r} is not a token of the tokenizer {cfg.data.tokenizer_model}: add it to the "
                f"tokenizer (a special token of tokenizer.json) or name one it has with {flag}"
            )
    return None
