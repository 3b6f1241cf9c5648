"""Run Megatron-Core's real CUDA code paths on CPU tensors over gloo.

Megatron-Core 0.16 assumes CUDA in a handful of places. This module bridges
exactly those places, and only while the training device is the CPU, so that
the real schedules (interleaved 1F1B included), p2p communication, DDP and the
distributed optimizer run unmodified in CPU processes:

1. **Device arguments.** Megatron-Core allocates with ``device="cuda"``,
   ``device=torch.cuda.current_device()`` and ``tensor.cuda()``. A
   ``TorchFunctionMode`` rewrites every CUDA device argument (and ``.cuda()``,
   ``.pin_memory()``) to the CPU before the op runs. ``torch.autograd.backward``
   itself dispatches to modes, and a mode is off while its handler runs, so
   ``torch.autograd``'s dispatch check is made blind to modes: the backward
   pass then runs under the mapping (sequence parallelism allocates its
   reduce-scatter buffers there).
2. **Tensor type names.** The optimizer checks ``param.type()`` against
   ``'torch.cuda.FloatTensor'`` and friends; the mode answers ``type()`` with
   the CUDA name of the same dtype.
3. **RNG.** ``CudaRNGStatesTracker`` saves/restores the CUDA generator around
   tensor-parallel regions (dropout). The CPU default generator stands in for
   the CUDA one, which keeps the tracker's semantics: a forked region draws
   from its own stream and the default stream is restored afterwards. The
   tracker warns when the CPU state changes inside a fork, which is exactly
   what standing in means, so that one warning is filtered (shown with
   ``MEGATRON_EXT_ALL_WARNINGS=1``, ``megatron_ext/notices.py``).
4. **Point-to-point tags.** In a 2-stage interleaved ring the previous and
   the next stage are the same process, so activations (to the next stage)
   and gradients (to the previous one) travel between the same pair. NCCL
   keeps them apart by call order; gloo matches messages by (peer, tag) and
   can mix them up. Megatron-Core's p2p helpers are replaced by ones that tag
   each direction (activations 1, gradients 2) and otherwise do the same.
   (Related, set in ``model.py``: ``deallocate_pipeline_outputs`` is off on
   CPU, because gloo sends read the buffer asynchronously.)
5. **Device queries.** ``torch.cuda.current_device`` answers 0,
   ``torch.cuda.synchronize`` does nothing, memory queries answer 0.

Nothing here is imported or active on a GPU run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from megatron_ext import notices

_CPU = torch.device("cpu")

# CUDA type names by dtype, as `torch.Tensor.type()` reports them on a GPU.
_CUDA_TYPE_NAMES = {
    torch.float32: "torch.cuda.FloatTensor",
    torch.float16: "torch.cuda.HalfTensor",
    torch.bfloat16: "torch.cuda.BFloat16Tensor",
    torch.float64: "torch.cuda.DoubleTensor",
    torch.int64: "torch.cuda.LongTensor",
    torch.int32: "torch.cuda.IntTensor",
    torch.uint8: "torch.cuda.ByteTensor",
    torch.bool: "torch.cuda.BoolTensor",
}


def _is_cuda_device(value: Any) -> bool:
    if isinstance(value, torch.device):
        return value.type == "cuda"
    if isinstance(value, str):
        return value.startswith("cuda")
    # A bare int device means "cuda:<int>" to torch.
    return isinstance(value, int) and not isinstance(value, bool)


class _CudaToCpuMode(TorchFunctionMode):
    """Maps CUDA device arguments of every torch call to the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda or func is torch.Tensor.pin_memory:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            tensor = args[0]
            name = _CUDA_TYPE_NAMES.get(tensor.dtype)
            if name is not None:
                return name
        if "device" in kwargs and _is_cuda_device(kwargs["device"]):
            kwargs = dict(kwargs, device=_CPU)
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda_device(args[1]):
            args = (args[0], _CPU, *args[2:])
        if kwargs.get("pin_memory"):
            kwargs = dict(kwargs, pin_memory=False)
        return func(*args, **kwargs)


def _autograd_dispatch_for_subclasses_only(args: Any) -> bool:
    """``torch.autograd``'s own torch-function check, blind to modes.

    ``torch.autograd.backward`` hands itself to an active mode, and a mode is
    switched off while its handler runs: the whole backward pass would run
    without the CUDA-to-CPU mapping, while Megatron-Core's autograd Functions
    allocate on "cuda" there too (sequence parallelism's reduce-scatter
    buffers). Tensor subclasses keep their dispatch.
    """
    return any(type(t) not in (torch.Tensor, torch.nn.Parameter) for t in args)


class _ForkWarningFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "CPU RNG state changed within GPU RNG context" not in record.getMessage()


# Each replacement is a distinct function object: torch.compile's rule table
# (built lazily from torch.cuda's attributes) rejects one object under two names.
def _returning(value: Any) -> Callable[..., Any]:
    def stand_in(*_args: Any, **_kwargs: Any) -> Any:
        return value

    return stand_in


def _cpu_get_rng_state() -> Callable[..., torch.Tensor]:
    def get_rng_state(*_args: Any, **_kwargs: Any) -> torch.Tensor:
        return torch.get_rng_state()

    return get_rng_state


def _cpu_set_rng_state() -> Callable[..., None]:
    def set_rng_state(new_state: torch.Tensor, *_args: Any, **_kwargs: Any) -> None:
        torch.set_rng_state(new_state)

    return set_rng_state


def _cpu_manual_seed(seed: int) -> None:
    torch.default_generator.manual_seed(int(seed))


class _NullStream:
    """``torch.cuda.current_stream()``'s stand-in: CPU work is ordered already, so waits are no-ops (Megatron-Core
    0.19's ``_ParamAndGradBucketGroup.start_grad_sync`` asks for the current stream on every gradient sync)."""

    def wait_event(self, *_args: Any, **_kwargs: Any) -> None:
        pass

    def wait_stream(self, *_args: Any, **_kwargs: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass


_ACTIVATION_TAG = 1  # send_next / recv_prev
_GRADIENT_TAG = 2  # send_prev / recv_next


def _tagged_ops(
    *,
    tensor_send_prev: torch.Tensor | None,
    tensor_recv_prev: torch.Tensor | None,
    tensor_send_next: torch.Tensor | None,
    tensor_recv_next: torch.Tensor | None,
    group: Any,
    prev_pipeline_rank: int,
    next_pipeline_rank: int,
) -> list[tuple[str, Any, torch.Tensor, int, int]]:
    dist = torch.distributed
    planned: list[tuple[str, Any, Any, int, int]] = [
        ("send_prev", dist.isend, tensor_send_prev, prev_pipeline_rank, _GRADIENT_TAG),
        ("recv_prev", dist.irecv, tensor_recv_prev, prev_pipeline_rank, _ACTIVATION_TAG),
        ("send_next", dist.isend, tensor_send_next, next_pipeline_rank, _ACTIVATION_TAG),
        ("recv_next", dist.irecv, tensor_recv_next, next_pipeline_rank, _GRADIENT_TAG),
    ]
    return [op for op in planned if op[2] is not None]


def _tagged_batched_p2p_ops(*, group: Any, **tensors_and_ranks: Any) -> list[Any]:
    """Megatron-Core's ``_batched_p2p_ops`` with a tag per direction."""
    ops = [
        torch.distributed.P2POp(fn, tensor, peer, group, tag)
        for _, fn, tensor, peer, tag in _tagged_ops(group=group, **tensors_and_ranks)
    ]
    return torch.distributed.batch_isend_irecv(ops) if ops else []


def _tagged_p2p_ops(*, group: Any, **tensors_and_ranks: Any) -> dict[str, Any]:
    """Megatron-Core's ``_p2p_ops`` (non-batched, returns named requests) with tags."""
    return {
        name: fn(tensor, peer, group=group, tag=tag)
        for name, fn, tensor, peer, tag in _tagged_ops(group=group, **tensors_and_ranks)
    }


def _patches() -> list[tuple[Any, str, Callable[..., Any]]]:
    from megatron.core.pipeline_parallel import p2p_communication
    from megatron.core.tensor_parallel import random as mcore_random

    return [
        (torch.cuda, "current_device", _returning(0)),
        (torch.cuda, "synchronize", _returning(None)),
        (torch.cuda, "current_stream", _returning(_NullStream())),
        (torch.cuda, "get_rng_state", _cpu_get_rng_state()),
        (torch.cuda, "set_rng_state", _cpu_set_rng_state()),
        (torch.cuda, "manual_seed", _cpu_manual_seed),
        # torch.manual_seed calls this after seeding the CPU generator.
        (torch.cuda, "manual_seed_all", _returning(None)),
        (torch.cuda, "memory_allocated", _returning(0)),
        (torch.cuda, "max_memory_allocated", _returning(0)),
        (torch.cuda, "reset_peak_memory_stats", _returning(None)),
        (torch.cuda, "empty_cache", _returning(None)),
        (mcore_random, "_get_cuda_rng_state", _cpu_get_rng_state()),
        (mcore_random, "_set_cuda_rng_state", _cpu_set_rng_state()),
        (torch.autograd, "has_torch_function", _autograd_dispatch_for_subclasses_only),
        (p2p_communication, "_batched_p2p_ops", _tagged_batched_p2p_ops),
        (p2p_communication, "_p2p_ops", _tagged_p2p_ops),
    ]


_active: list[tuple[Any, str, Any]] | None = None
_mode: _CudaToCpuMode | None = None
_filter = _ForkWarningFilter()


def enable() -> None:
    """Activate the CPU backend for this process (idempotent)."""
    global _active, _mode
    if _active is not None:
        return
    _active = []
    for owner, name, replacement in _patches():
        _active.append((owner, name, getattr(owner, name)))
        setattr(owner, name, replacement)
    if not notices.showing_everything():
        logging.getLogger("megatron.core.tensor_parallel.random").addFilter(_filter)
    _mode = _CudaToCpuMode()
    _mode.__enter__()


def disable() -> None:
    """Undo :func:`enable` (used by tests)."""
    global _active, _mode
    if _active is None:
        return
    assert _mode is not None
    _mode.__exit__(None, None, None)
    for owner, name, original in reversed(_active):
        setattr(owner, name, original)
    logging.getLogger("megatron.core.tensor_parallel.random").removeFilter(_filter)
    _active = None
    _mode = None


def is_enabled() -> bool:
    return _active is not None


@contextmanager
def cpu_backend() -> Iterator[None]:
    """Context manager form of :func:`enable` / :func:`disable`."""
    enable()
    try:
        yield
    finally:
        disable()
