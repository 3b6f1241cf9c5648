"""Process groups and seeds: one entry point for CPU (gloo) and GPU (NCCL)."""

from __future__ import annotations

import datetime
import logging
import os
import random
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from megatron_ext.cli.launch import free_port
from megatron_ext.config.layout import ParallelLayout
from megatron_ext.config.runtime import serial_cuda_connections

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistributedContext:
    """Where this process sits in the grid."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    tp_rank: int
    pp_rank: int
    dp_rank: int

    @property
    def is_logging_rank(self) -> bool:
        """The last rank logs: it is on the last pipeline stage, where the loss is."""
        return self.rank == self.world_size - 1


def resolve_device(choice: str) -> torch.device:
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda was given but torch sees no CUDA device; use --device cpu")
    return torch.device(choice)


def world_size_from_env() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def initialize(
    *, layout: ParallelLayout, device_choice: str, seed: int, timeout_minutes: int = 10
) -> DistributedContext:
    """Create the process group and Megatron-Core's parallel state; seed every RNG.

    Works under torchrun / srun (env:// rendezvous) and as a single process
    without any launcher (a one-process group on a free local port).
    """
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    device = resolve_device(device_choice)
    rank = int(os.environ.get("RANK", "0"))
    world_size = world_size_from_env()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if world_size != layout.world_size:
        raise RuntimeError(
            f"the layout was validated for world_size={layout.world_size} "
            f"but the launcher started {world_size} processes"
        )
    if device.type == "cpu":
        from megatron_ext.training import cpu_backend

        cpu_backend.enable()
        backend = "gloo"
    else:
        _set_cuda_connections(layout)
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        backend = "nccl"
    if "MASTER_ADDR" not in os.environ:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    if not dist.is_initialized():
        dist.init_process_group(
            backend=backend,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(minutes=timeout_minutes),
        )
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vp if layout.interleaved else None,
        context_parallel_size=layout.cp,
        distributed_timeout_minutes=timeout_minutes,
    )
    ctx = DistributedContext(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        device=device,
        tp_rank=parallel_state.get_tensor_model_parallel_rank(),
        pp_rank=parallel_state.get_pipeline_model_parallel_rank(),
        dp_rank=parallel_state.get_data_parallel_rank(),
    )
    # As Megatron-LM: different seeds per pipeline stage for initialisation;
    # the tracker derives the tensor-parallel dropout streams.
    stage_seed = seed + 100 * ctx.pp_rank
    random.seed(stage_seed)
    np.random.seed(stage_seed)
    torch.manual_seed(stage_seed)
    model_parallel_cuda_manual_seed(stage_seed)
    return ctx


def _set_cuda_connections(layout: ParallelLayout) -> None:
    """One hardware work queue when TP communicates inside every layer.

    Why: ``config.runtime.serial_cuda_connections``. Must be set before the
    CUDA context exists; a value the user chose is kept.
    """
    if (
        serial_cuda_connections(tensor_model_parallel_size=layout.tp)
        and "CUDA_DEVICE_MAX_CONNECTIONS" not in os.environ
    ):
        os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
        log.info("CUDA_DEVICE_MAX_CONNECTIONS=1 (tensor parallelism overlaps its communication with GEMMs)")


def destroy() -> None:
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
