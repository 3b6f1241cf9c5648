"""Megatron-LM's two training loaders: single (in order from the consumed position) and cyclic (every epoch in
the order of torch.randperm seeded with the epoch, within each DP rank's bucket or over the whole dataset)."""

from __future__ import annotations

import itertools

import pytest
import torch

from megatron_ext.config.training_config import parse_args
from megatron_ext.training.datasets import PretrainingRandomSampler, PretrainingSampler, make_iterator

pytestmark = pytest.mark.unit

TOTAL, MICRO, DP = 27, 2, 3  # 27 samples, 6 per step: one epoch is 24 (the 3 left over are never read)


def _ranks(consumed: int, *, sharding: bool, steps: int) -> list[list[list[int]]]:
    """``steps`` micro-batches of each DP rank, from ``consumed``."""
    samplers = [
        PretrainingRandomSampler(total_samples=TOTAL, consumed_samples=consumed, micro_batch_size=MICRO,
                                 data_parallel_rank=r, data_parallel_size=DP, data_sharding=sharding)
        for r in range(DP)
    ]  # fmt: skip
    return [list(itertools.islice(itertools.chain.from_iterable(itertools.repeat(s, 4)), steps)) for s in samplers]


@pytest.mark.parametrize("sharding", [True, False], ids=["data-sharding", "no-data-sharding"])
def test_each_epoch_reads_every_sample_once_in_the_epochs_own_order(sharding: bool) -> None:
    per_rank = _ranks(0, sharding=sharding, steps=8)  # two epochs of 4 steps
    for epoch in range(2):
        read = [i for rank in per_rank for batch in rank[4 * epoch : 4 * epoch + 4] for i in batch]
        # data sharding: 3 buckets of 8 (the first 24 samples); without: a permutation of the 26 micro-batch-aligned
        assert sorted(read) == sorted(set(read)) and len(read) == 24 and max(read) < (24 if sharding else 26)
    first = [i for batch in per_rank[0][:4] for i in batch]
    second = [i for batch in per_rank[0][4:] for i in batch]
    assert first != second  # a new order each epoch
    if sharding:  # rank r reads only its own 8-sample bucket, in randperm(8, seed=epoch)'s order
        assert first == torch.randperm(8, generator=torch.Generator().manual_seed(0)).tolist()
        assert all(16 <= i < 24 for batch in per_rank[2] for i in batch)
    else:  # randperm(26) over the whole (micro-batch-aligned) dataset, dealt out rank by rank
        order = torch.randperm(26, generator=torch.Generator().manual_seed(0)).tolist()
        assert first == order[0::3][:8]


@pytest.mark.parametrize("sharding", [True, False], ids=["data-sharding", "no-data-sharding"])
def test_resuming_at_any_step_continues_the_same_order(sharding: bool) -> None:
    whole = _ranks(0, sharding=sharding, steps=10)
    for step in (1, 4, 7):
        resumed = _ranks(step * MICRO * DP, sharding=sharding, steps=10 - step)
        assert resumed == [rank[step:] for rank in whole], step


def test_single_reads_in_order_and_cyclic_is_chosen_by_the_flag() -> None:
    single = PretrainingSampler(total_samples=TOTAL, consumed_samples=6, micro_batch_size=MICRO,
                                data_parallel_rank=1, data_parallel_size=DP)  # fmt: skip
    assert list(single)[:2] == [[8, 9], [14, 15]]
    base = ["--mock-data", "--micro-batch-size", "2", "--global-batch-size", "2"]
    dataset = [{"tokens": torch.tensor([i])} for i in range(7)]
    cyclic = make_iterator(
        dataset, cfg=parse_args([*base, "--dataloader-type", "cyclic"]), consumed_samples=0, dp_rank=0
    )
    assert cyclic is not None
    batches = [next(cyclic)["tokens"].flatten().tolist() for _ in range(6)]  # two epochs of 3: it cycles
    assert sorted(i for b in batches[:3] for i in b) == list(range(6)) == sorted(i for b in batches[3:] for i in b)
    plain = make_iterator(dataset, cfg=parse_args(base), consumed_samples=0, dp_rank=0)
    assert plain is not None and [next(plain)["tokens"].flatten().tolist() for _ in range(3)] == [
        [0, 1],
        [2, 3],
        [4, 5],
    ]
