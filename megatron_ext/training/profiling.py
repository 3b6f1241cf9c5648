"""``--profile``: Megatron-LM's profiling of chosen steps on chosen ranks.

* With ``--use-pytorch-profiler``: PyTorch's profiler records iterations
  ``--profile-step-start`` to ``--profile-step-end`` (1-based: steps start+1 to
  end, after one warm-up step) with shapes and stacks, and writes a trace per
  rank into ``--tensorboard-dir`` (TensorBoard's profiler plugin, or Perfetto).
  It works on CPU too.
* Without it: CUDA's profiler API is started before step start+1 and stopped
  after step end, with NVTX ranges for every autograd op, for
  ``nsys profile --capture-range=cudaProfilerApi``. GPU only.
* ``--record-memory-history``: PyTorch records CUDA allocations from the start,
  and the last rank writes a snapshot to ``--memory-snapshot-path`` at every
  logged iteration (``pytorch.org/memory_viz``). GPU only.

Steps are counted from the start of training, as ``--exit-interval`` is, so
a resumed run profiles the same steps only if they are still ahead of it.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
from pathlib import Path
from typing import Any

import torch

from megatron_ext.config.arguments import ConfigError
from megatron_ext.config.run_args import RunArgs

log = logging.getLogger("megatron_ext")

MEMORY_HISTORY_ENTRIES = 100_000
"""Allocation events kept before a snapshot (Megatron-LM's number)."""


class Profiler:
    """The loop calls ``before_step`` with the iterations done so far, ``after_step`` with the new count,
    ``at_log`` at each logged iteration, and ``close`` at the end."""

    def __init__(self, run: RunArgs, *, rank: int, is_last_rank: bool, device: torch.device, first_iteration: int):
        on_gpu = device.type == "cuda"
        if run.profile and not run.use_pytorch_profiler and not on_gpu:
            raise ConfigError(
                "--profile without --use-pytorch-profiler marks NVTX ranges for nsys, which needs a GPU; on CPU add "
                "--use-pytorch-profiler"
            )
        if run.record_memory_history and not on_gpu:
            raise ConfigError("--record-memory-history records CUDA allocations, which needs a GPU; drop it on CPU")
        self.run = run
        self.active = run.profile and rank in run.profile_ranks
        self.snapshots = run.record_memory_history and is_last_rank
        self._torch: Any = None
        self._nvtx: Any = None
        if run.record_memory_history:
            # Allocations and frees with their stacks (Megatron-LM's legacy call, in today's spelling).
            torch.cuda.memory._record_memory_history(enabled="all", max_entries=MEMORY_HISTORY_ENTRIES)
        if self.active and run.use_pytorch_profiler:
            start, end = run.profile_step_start, run.profile_step_end
            if end <= first_iteration:
                log.warning(
                    "--profile: steps %d-%d are behind this run (it starts after %d)", start, end, first_iteration
                )
                self.active = False
                return
            ahead = max(start - first_iteration, 0)
            activities = [torch.profiler.ProfilerActivity.CPU]
            if on_gpu:
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            assert run.tensorboard_dir is not None  # RunArgs requires it
            self._torch = torch.profiler.profile(
                activities=activities,
                # Profiler step n is done-count first + n - 1 (step() is called before each iteration):
                # record done-counts start..end-1 after one warm-up step.
                schedule=torch.profiler.schedule(wait=ahead, warmup=1, active=end - first_iteration - ahead, repeat=1),
                on_trace_ready=torch.profiler.tensorboard_trace_handler(run.tensorboard_dir),
                record_shapes=True,
                with_stack=True,
            )
            self._torch.start()

    def before_step(self, iteration: int) -> None:
        if not self.active:
            return
        if self._torch is not None:
            self._torch.step()
        elif iteration == self.run.profile_step_start:
            torch.cuda.check_error(torch.cuda.cudart().cudaProfilerStart())
            self._nvtx = torch.autograd.profiler.emit_nvtx(record_shapes=True)
            self._nvtx.__enter__()

    def after_step(self, iteration: int) -> None:
        if self.active and iteration == self.run.profile_step_end:
            self.close()

    def at_log(self) -> None:
        if self.snapshots:
            path = Path(self.run.memory_snapshot_path)
            with open(path, "wb") as f:
                pickle.dump(torch.cuda.memory._snapshot(), f)

    def close(self) -> None:
        """Stop whatever is still recording (the run ended or stopped before --profile-step-end)."""
        if self._torch is not None:
            self._torch.stop()
            self._torch = None
            log.info("profiler trace written to %s", self.run.tensorboard_dir)
        if self._nvtx is not None:
            torch.cuda.check_error(torch.cuda.cudart().cudaProfilerStop())
            with contextlib.suppress(Exception):
                self._nvtx.__exit__(None, None, None)
            self._nvtx = None
        self.active = False
