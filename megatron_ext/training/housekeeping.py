"""Garbage collection and the GPU memory cache, at the points Megatron-LM's training loop uses.

``--manual-gc``: Python's collector is turned off at the start (after one
collection) and run every ``--manual-gc-interval`` iterations, and around each
evaluation unless ``--no-manual-gc-eval``, so that the ranks of a large job do
not each pause at their own moment and hold the others up at the next
collective. ``--empty-unused-memory-level``: PyTorch's cached GPU memory is
released after each forward-backward (1) and also after each optimizer step
(2); nothing on CPU.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from megatron_ext.config.run_args import RunArgs


def _empty_cuda_cache() -> None:
    torch.cuda.empty_cache()


@dataclass
class Housekeeping:
    """The training loop calls these at its points; what each does follows the run's flags. The collector and
    the cache are injectable for tests."""

    run: RunArgs
    on_gpu: bool
    collect: Callable[..., object] = field(default=gc.collect)
    disable: Callable[[], None] = field(default=gc.disable)
    empty_cache: Callable[[], None] = field(default=_empty_cuda_cache)

    def start(self) -> None:
        if self.run.manual_gc:
            self.disable()
            self.collect()

    def after_forward_backward(self) -> None:
        if self.on_gpu and self.run.empty_unused_memory_level >= 1:
            self.empty_cache()

    def after_optimizer_step(self) -> None:
        if self.on_gpu and self.run.empty_unused_memory_level >= 2:
            self.empty_cache()

    def after_iteration(self, iteration: int) -> None:
        interval = self.run.manual_gc_interval
        if self.run.manual_gc and interval and iteration % interval == 0:
            self.collect()

    def before_evaluation(self) -> None:
        if self.run.manual_gc and not self.run.no_manual_gc_eval:
            self.collect()

    def after_evaluation(self) -> None:
        # Only what the evaluation made and dropped (Megatron-LM: the youngest generation).
        if self.run.manual_gc and not self.run.no_manual_gc_eval:
            self.collect(generation=0)
