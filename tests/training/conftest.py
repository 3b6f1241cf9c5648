"""The resumable run shared by the resilience and checkpoint-fault tests (one saved run, many damaged copies),
and the one-process gloo group of the tests that build Megatron-Core modules in the test's own process."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from megatron_ext.config.exit_codes import ExitCode
from tests.conftest import TINY_MODEL, _free_port, run_pretrain
from tests.once import once_per_run

ITERS = 20
RUN = [
    *TINY_MODEL,
    *"--hidden-dropout 0.1 --attention-dropout 0.1".split(),
    *"--pipeline-model-parallel-size 2 --virtual-pipeline-model-parallel-size 2".split(),
    *("--lr-decay-iters", str(ITERS), "--train-iters", str(ITERS)),
]
"""The tiny GPT under PP2 × VP2 with dropout (so the RNG states must come back exactly), 20 iterations: room
for a signal after several saves; every resumed iteration costs each test that resumes."""


def saved_run(tmp_path: Path, *extra: str) -> Path:
    """RUN stopped (exit code 75) at iteration 3 with ``extra`` flags; its --save directory."""
    save = tmp_path / "ckpt"
    run_pretrain(
        [*RUN, "--save", str(save), "--exit-interval", "3", *extra], nproc=2, expect=ExitCode.SAVED_AND_STOPPED
    )
    return save


@pytest.fixture(scope="session")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """RUN stopped at iteration 3 with a checkpoint of every iteration (1, 2, 3), shared: tests that damage
    or might write it take a ``copy_of`` it."""
    return (
        once_per_run(tmp_path_factory, "saved", lambda directory: saved_run(directory, "--save-interval", "1")) / "ckpt"
    )


def copy_of(saved: Path, tmp_path: Path) -> Path:
    """A private copy of the shared checkpoints, for a test that damages or might write them."""
    copy = tmp_path / "ckpt"
    shutil.copytree(saved, copy)
    return copy


@pytest.fixture(scope="module")
def parallel_state() -> Iterator[None]:
    """A one-process gloo group and Megatron-Core's parallel state (TP = PP = DP = 1) on the CPU backend."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from megatron_ext.training import cpu_backend

    cpu_backend.enable()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    ps.initialize_model_parallel()
    model_parallel_cuda_manual_seed(123)
    yield
    ps.destroy_model_parallel()
    dist.destroy_process_group()
    cpu_backend.disable()
