"""Training data: Megatron-Core datasets, a resumable sampler, per-chunk iterators.

Datasets come from Megatron-Core's ``BlendedMegatronDatasetBuilder``:
``GPTDataset`` over the indexed datasets of ``--data-path`` (a weighted blend
split by ``--split``, or ``--train/valid/test-data-path``), or
``MockGPTDataset`` for ``--mock-data``, or Megatron-LM's ``GPTFIMDataset`` for
``--fim-data``. The sampler is position-based
(``consumed_samples``) like Megatron-LM's, so a resumed run continues with
exactly the samples an uninterrupted one would have seen, for any DP size:
every step takes the next global batch of samples in order (``[k·B, (k+1)·B)``
for step ``k`` without a batch ramp-up) and each DP rank takes its slice of
every ``micro_batch × DP`` block.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from megatron_ext.config import iterations
from megatron_ext.config.training_config import TrainingConfig
from megatron_ext.data import sources as data_sources
from megatron_ext.data.tokenizer_base import Tokenizer
from megatron_ext.training import helper_processes


@dataclass(frozen=True)
class Datasets:
    train: Any
    valid: Any | None
    test: Any | None


def dataset_config(cfg: TrainingConfig, tokenizer: Tokenizer) -> Any:
    """Megatron-Core's ``GPTDatasetConfig`` for this run: blend (or one blend per split), split, cache."""
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig

    blend = blend_per_split = None
    split: str | None = cfg.data.split
    if not cfg.data.mock_data:
        sources = data_sources.blends(cfg.data)
        if "data" in sources:
            blend = sources["data"].as_megatron()  # type: ignore[union-attr]
        else:
            blend_per_split = [b.as_megatron() if b is not None else None for b in sources.values()]
            split = None
    config_class: Any = GPTDatasetConfig
    fim: dict[str, Any] = {}
    if cfg.data.fim_data:
        from megatron.training.datasets.fim_dataset import GPTFIMDatasetConfig

        config_class = GPTFIMDatasetConfig
        tokenizer = megatron_core_tokenizer(cfg, tokenizer)
        d = cfg.data
        fim = {
            "fim_rate": d.fim_rate,
            "fim_spm_rate": d.fim_spm_rate,
            "fim_extra_tokens": d.fim_tokens,
            "fim_split_sample": d.fim_split_sample,
            "fim_fragment_rate": d.fim_fragment_rate,
            "fim_no_prefix": d.fim_no_prefix,
        }
    config = config_class(
        **fim,
        random_seed=cfg.optim.seed,
        sequence_length=cfg.model.seq_length,
        blend=blend,
        blend_per_split=blend_per_split,
        split=split,
        path_to_cache=cfg.data.data_cache_path,
        tokenizer=tokenizer,
        reset_position_ids=cfg.data.reset_position_ids,
        reset_attention_mask=cfg.data.document_attention_mask,
        eod_mask_loss=cfg.data.eod_mask_loss,
        # Without --reset-attention-mask attention is causal over the whole sequence: no mask tensor is built.
        create_attention_mask=cfg.data.document_attention_mask,
        # --dataloader-inter-document-masking: each sample carries its documents' cu_seqlens (no mask).
        inter_document_masking=cfg.data.dataloader_inter_document_masking,
        mmap_bin_files=not cfg.data.no_mmap_bin_files,
        num_dataset_builder_threads=cfg.data.num_dataset_builder_threads,
        mid_level_dataset_surplus=cfg.data.mid_level_dataset_surplus,
        allow_ambiguous_pad_tokens=cfg.data.allow_ambiguous_pad_tokens,
        fast_cache_load=cfg.data.dataloader_fast_cache_load,
        defer_npy_index_mmap=cfg.data.dataloader_defer_npy_index_mmap,
    )
    if config.split_matrix is not None:
        # Valid and test splits no step reads (no --eval-iters) are not built: Megatron-Core would still
        # index them, and an empty one (a small corpus's 0.1% test split) would loop forever.
        train, *evaluated = config.split_matrix
        _, *sizes = iterations.split_samples(cfg.run, cfg.batch, cfg.layout)
        config.split_matrix = [train, *(part if size else None for part, size in zip(evaluated, sizes, strict=True))]
    return config


def megatron_core_tokenizer(cfg: TrainingConfig, ours: Tokenizer) -> Any:
    """Megatron-Core's own tokenizer of the run's tokenizer files, built by Megatron-Core's ``build_tokenizer`` from
    Megatron-LM's arguments and defaults, as Megatron-LM 0.19 builds it: GPTFIMDataset re-tokenizes text through its
    library tokenizer. It must agree with ours on the vocabulary and the end of document, which the datasets were
    made and checked with."""
    import argparse

    from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer

    from megatron_ext.config.arguments import ConfigError

    args = argparse.Namespace(
        tokenizer_type=cfg.data.tokenizer_type,
        tokenizer_model=cfg.data.tokenizer_model,
        vocab_file=cfg.data.vocab_file,
        merge_file=cfg.data.merge_file,
        chat_template=None,
        special_tokens=None,  # Megatron-LM's --special-tokens: none added
        tokenizer_hf_no_use_fast=False,
        tokenizer_hf_no_include_special_tokens=False,
        trust_remote_code=False,
        metadata_path=None,
        pad_vocab_size=False,
    )
    theirs = build_tokenizer(args)
    if (theirs.vocab_size, theirs.eod) != (ours.vocab_size, ours.eod):
        raise ConfigError(
            f"--fim-data: Megatron-Core's tokenizer of {cfg.data.tokenizer_model} has {theirs.vocab_size} tokens and "
            f"end of document {theirs.eod}, ours {ours.vocab_size} and {ours.eod}: the FIM samples would not match the "
            "dataset; use a tokenizer directory both read alike"
        )
    return theirs


def build_datasets(cfg: TrainingConfig, tokenizer: Tokenizer) -> Datasets:
    """Train / valid / test datasets from Megatron-Core's ``BlendedMegatronDatasetBuilder``.

    Every rank builds (``is_built_on_rank`` is always true): Megatron-Core
    builds on global rank 0 first, writes the sample and shuffle indices to the
    cache, then the other ranks read them after a barrier on the default group.
    Validation and test sets are sized for ``--eval-iters`` global batches.
    """
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, MockGPTDataset

    config = dataset_config(cfg, tokenizer)
    cls: Any = MockGPTDataset if cfg.data.mock_data else GPTDataset
    if cfg.data.fim_data:
        from megatron.training.datasets.fim_dataset import GPTFIMDataset

        cls = GPTFIMDataset
    train, valid, test = BlendedMegatronDatasetBuilder(
        cls, iterations.split_samples(cfg.run, cfg.batch, cfg.layout), lambda: True, config
    ).build()
    if train is None or len(train) == 0:
        raise data_sources.DataError(
            "the training split is empty: give it a share in --split (e.g. 969,30,1) or pass --train-data-path"
        )
    return Datasets(train=train, valid=valid, test=test)


class PretrainingSampler:
    """Yields this DP rank's sample indices, one micro-batch at a time.

    Starts at ``consumed_samples`` (global count), so resuming is exact.
    """

    def __init__(
        self,
        *,
        total_samples: int,
        consumed_samples: int,
        micro_batch_size: int,
        data_parallel_rank: int,
        data_parallel_size: int,
    ) -> None:
        self.total_samples = total_samples
        self.consumed_samples = consumed_samples
        self.micro_batch_size = micro_batch_size
        self.dp_rank = data_parallel_rank
        self.dp_size = data_parallel_size

    def __len__(self) -> int:
        """Micro-batches this rank will yield (a batch sampler counts batches)."""
        block = self.micro_batch_size * self.dp_size
        return max(self.total_samples - self.consumed_samples, 0) // block

    def __iter__(self) -> Iterator[list[int]]:
        block = self.micro_batch_size * self.dp_size
        for block_start in range(self.consumed_samples, self.total_samples - block + 1, block):
            first = block_start + self.dp_rank * self.micro_batch_size
            yield list(range(first, first + self.micro_batch_size))


class PretrainingRandomSampler(PretrainingSampler):
    """``--dataloader-type cyclic``: Megatron-LM's ``MegatronPretrainingRandomSampler``. Epoch ``e`` (of the
    dataset's samples that fill whole micro-batches on every DP rank) is read in the order of
    ``torch.randperm`` seeded with ``e``: within each DP rank's own contiguous bucket (data sharding, the
    default), or over the whole dataset dealt round-robin (``--no-data-sharding``). Starts at
    ``consumed_samples`` and counts what it yields, so iterating again continues with the next epoch."""

    def __init__(self, *, data_sharding: bool = True, **position: int) -> None:
        super().__init__(**position)
        if self.total_samples <= 0:
            raise ValueError(f"no sample to read: {self.total_samples}")
        self.data_sharding = data_sharding
        self.block = self.micro_batch_size * self.dp_size

    def __len__(self) -> int:
        return self.total_samples

    def __iter__(self) -> Iterator[list[int]]:
        active = self.total_samples - self.total_samples % self.block
        epoch, done = divmod(self.consumed_samples, active)
        generator = torch.Generator()
        generator.manual_seed(epoch)
        if self.data_sharding:
            bucket = (self.total_samples // self.block) * self.micro_batch_size
            order = torch.randperm(bucket, generator=generator).tolist()
            indices = [self.dp_rank * bucket + i for i in order[done // self.dp_size :]]
        else:
            whole = (self.total_samples // self.micro_batch_size) * self.micro_batch_size
            order = torch.randperm(whole, generator=generator).tolist()
            indices = order[done:][self.dp_rank :: self.dp_size]
        for start in range(0, len(indices) - self.micro_batch_size + 1, self.micro_batch_size):
            self.consumed_samples += self.block
            yield indices[start : start + self.micro_batch_size]


def make_iterator(
    dataset: Any,
    *,
    cfg: TrainingConfig,
    consumed_samples: int,
    dp_rank: int,
) -> Iterator[dict[str, torch.Tensor]] | None:
    """An iterator of this rank's micro-batches (a dict of tensors), or None without data."""
    if dataset is None or len(dataset) == 0:
        return None
    layout = cfg.layout

    cyclic = cfg.data.dataloader_type == "cyclic"

    def loader(consumed: int) -> torch.utils.data.DataLoader:
        position = {
            "total_samples": len(dataset),
            "consumed_samples": consumed,
            "micro_batch_size": layout.micro_batch_size,
            "data_parallel_rank": dp_rank,
            "data_parallel_size": layout.dp,
        }
        sampler = (
            PretrainingRandomSampler(**position, data_sharding=not cfg.data.no_data_sharding)
            if cyclic
            else PretrainingSampler(**position)
        )
        return torch.utils.data.DataLoader(
            dataset,
            batch_sampler=sampler,
            num_workers=cfg.data.num_workers,
            # Page-locked batches make the forward step's non_blocking copies asynchronous.
            pin_memory=cfg.run.device != "cpu" and torch.cuda.is_available(),
            persistent_workers=cfg.data.num_workers > 0,
            # Its own generator: creating an iterator draws a worker seed, which
            # from the global RNG would shift dropout after a resume.
            generator=torch.Generator().manual_seed(cfg.optim.seed),
            # Workers leave planned stops to the rank and end with it (helper_processes).
            worker_init_fn=functools.partial(helper_processes.data_loader_worker_init, os.getpid())
            if cfg.data.num_workers > 0
            else None,
        )

    if cyclic:  # Megatron-LM's cyclic_iter: each pass over the loader is the sampler's next epoch
        return _cycle(loader(consumed_samples))
    return iter(loader(consumed_samples))


def _cycle(loader: torch.utils.data.DataLoader) -> Iterator[dict[str, torch.Tensor]]:
    while True:
        yield from loader


def chunk_iterators(
    dataset: Any,
    *,
    cfg: TrainingConfig,
    consumed_samples: int,
    dp_rank: int,
    needs_data: list[bool],
) -> list[Iterator[dict[str, torch.Tensor]] | None]:
    """One iterator per model chunk: chunks that embed or compute the loss read
    the same micro-batches in the same order; middle chunks read nothing."""
    return [
        make_iterator(dataset, cfg=cfg, consumed_samples=consumed_samples, dp_rank=dp_rank) if needed else None
        for needed in needs_data
    ]
