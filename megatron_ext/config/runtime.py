"""Facts the launcher (``recipes/common.sh`` through ``megatron_ext.cli.recipe``) shares with the runtime."""

from __future__ import annotations

TRACKER_FILENAME = "latest_checkpointed_iteration.txt"
"""Under ``--save``: the iteration of the last complete checkpoint (Megatron-LM's name and format)."""


def serial_cuda_connections(*, tensor_model_parallel_size: int) -> bool:
    """Whether ``CUDA_DEVICE_MAX_CONNECTIONS=1`` must be set before CUDA starts.

    Megatron-Core overlaps a layer's tensor-parallel all-reduce / all-gather
    with its weight-gradient GEMM by launching the communication first; with a
    single hardware queue the GPU starts them in that order, otherwise the GEMM
    can take the SMs first and the overlap is lost (sequence parallelism needs
    TP > 1, so it is covered).
    """
    return tensor_model_parallel_size > 1
