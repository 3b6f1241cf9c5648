"""Training data: Megatron-Core datasets, a resumable sampler, per-chunk iterators.

Datasets come from Megatron-Core's ``BlendedMegatronDatasetBuilder``
(``MockGPTDataset`` for ``--mock-data``). The sampler is position-based
(``consumed_samples``) like Megatron-LM's, so a resumed run continues with
exactly the samples an uninterrupted one would have seen, for any DP size:
step ``k`` always covers global samples ``[k·B, (k+1)·B)`` and each DP rank
takes its slice of every ``micro_batch × DP`` block.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from megatron_ext.arguments import TrainingConfig


@dataclass(frozen=True)
class Datasets:
    train: Any
    valid: Any | None
    test: Any | None


def build_tokenizer(cfg: TrainingConfig) -> Any:
    """The tokenizer the datasets need (end-of-document id, vocabulary size)."""
    if cfg.data.tokenizer_type != "NullTokenizer":
        raise NotImplementedError(f"--tokenizer-type {cfg.data.tokenizer_type}: only NullTokenizer is supported so far")
    from megatron.core.tokenizers.text.libraries.null_tokenizer import NullTokenizer

    assert cfg.model.vocab_size is not None
    return NullTokenizer(cfg.model.vocab_size)


def dataset_sizes(cfg: TrainingConfig) -> list[int]:
    """Samples needed for train / valid / test.

    Every evaluation reads the same first ``eval_iters`` global batches of the
    validation split, so successive validation losses are comparable.
    """
    gbs = cfg.layout.global_batch_size
    run = cfg.run
    evaluated = run.eval_iters * gbs if run.eval_iters > 0 else 0
    return [run.train_iters * gbs, evaluated, evaluated]


def build_datasets(cfg: TrainingConfig, tokenizer: Any) -> Datasets:
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig, MockGPTDataset

    config = GPTDatasetConfig(
        random_seed=cfg.optim.seed,
        sequence_length=cfg.model.seq_length,
        split=cfg.data.split,
        path_to_cache=cfg.data.data_cache_path,
        tokenizer=tokenizer,
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,
        mid_level_dataset_surplus=0.005,
    )
    if not cfg.data.mock_data:
        raise NotImplementedError("--data-path: indexed datasets are not supported yet; use --mock-data")
    train, valid, test = BlendedMegatronDatasetBuilder(MockGPTDataset, dataset_sizes(cfg), lambda: True, config).build()
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
        return self.total_samples

    def __iter__(self) -> Iterator[list[int]]:
        block = self.micro_batch_size * self.dp_size
        for block_start in range(self.consumed_samples, self.total_samples - block + 1, block):
            first = block_start + self.dp_rank * self.micro_batch_size
            yield list(range(first, first + self.micro_batch_size))


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

    def loader(consumed: int) -> torch.utils.data.DataLoader:
        sampler = PretrainingSampler(
            total_samples=len(dataset),
            consumed_samples=consumed,
            micro_batch_size=layout.micro_batch_size,
            data_parallel_rank=dp_rank,
            data_parallel_size=layout.dp,
        )
        return torch.utils.data.DataLoader(
            dataset,
            batch_sampler=sampler,
            num_workers=cfg.data.num_workers,
            pin_memory=False,
            persistent_workers=cfg.data.num_workers > 0,
            # Its own generator: creating an iterator draws a worker seed, which
            # from the global RNG would shift dropout after a resume.
            generator=torch.Generator().manual_seed(cfg.optim.seed),
        )

    return iter(loader(consumed_samples))


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
