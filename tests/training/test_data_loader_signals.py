"""Data-loader workers survive the stop signals that SLURM sends to every process of a job step."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from megatron_ext.config.training_config import parse_args
from megatron_ext.training.datasets import make_iterator

pytestmark = pytest.mark.unit


class SignalledDataset(torch.utils.data.Dataset):
    """Each sample sends SIGUSR1 to the worker process that loads it, as slurmstepd would."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        os.kill(os.getpid(), signal.SIGUSR1)
        return {"tokens": torch.full((4,), index)}


def test_workers_ignore_sigusr1() -> None:
    cfg = parse_args("--mock-data --num-workers 1 --micro-batch-size 2 --global-batch-size 2".split(), world_size=1)
    batches = make_iterator(SignalledDataset(), cfg=cfg, consumed_samples=4, dp_rank=0)
    assert batches is not None
    first, second = next(batches), next(batches)
    assert first["tokens"][:, 0].tolist() == [4, 5] and second["tokens"][:, 0].tolist() == [6, 7]
