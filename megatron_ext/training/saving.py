"""A run's checkpoint saves: one in flight at a time, and a periodic one that may fail once.

``checkpointing`` writes one checkpoint; this module decides what a run does
around it. With ``--async-save`` the files are written in the background
(Megatron-Core's ``AsyncCallsQueue``), and every save first finishes the one
before it, so the tracker always names the newest finished save. A periodic
save (``--save-interval``) that fails (disk full, read-only, an I/O error)
removes its own partial directory, prints one line on every rank, and
training goes on to the next interval, once every rank has seen it fail; a
second failure in a row, a failure that not every rank saw, or a failed save
at a planned stop or at the end of training, stops the run (exit 3). A
failure because a peer died is that, never a failed save to go on from.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from megatron_ext.checkpoint.run_identity import RunIdentity
from megatron_ext.config.training_config import TrainingConfig
from megatron_ext.training import checkpointing, distributed
from megatron_ext.training.progress_log import ProgressLog
from megatron_ext.training.save_faults import save_failed

log = logging.getLogger(__name__)

AGREE_S = 120
"""How long ranks whose periodic save failed wait for the others to say theirs failed too."""


class Saves:
    """The saves of one run (every method is a collective: all ranks call it at the same point)."""

    def __init__(self, cfg: TrainingConfig, *, progress: ProgressLog, rank: int) -> None:
        self.cfg = cfg
        self.progress = progress
        self.rank = rank
        self.async_queue: Any = None
        if cfg.run.async_save:
            from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

            self.async_queue = AsyncCallsQueue()
        self.saving: Path | None = None
        """The checkpoint being written in the background, if any."""
        self.saving_iteration = 0
        self.saving_periodic = False
        self.failed = 0
        """Saves that failed in a row."""
        self.last_saved: int | None = None
        """The iteration of the newest checkpoint this run wrote or loaded (None: none yet, or its save failed)."""
        self._agreement: Any = None
        """The gloo group in which ranks whose periodic save failed check that every rank's did."""
        if cfg.run.save and cfg.run.save_interval > 0 and dist.get_world_size() > 1:
            self._agreement = dist.new_group(backend="gloo")  # a collective: every rank builds its Saves here

    def finish(self, *, blocking: bool = True) -> bool:
        """Finalise the background save in flight, if any; returns False when it failed (it was removed, and
        unless it was a periodic save that may fail once, a CheckpointError is raised)."""
        if self.async_queue is None or self.saving is None:
            return True
        try:
            self.async_queue.maybe_finalize_async_calls(blocking=blocking)
        except (Exception, CheckpointException) as exc:  # torch's CheckpointException is a BaseException
            failed, self.saving = self.saving, None
            self.last_saved = None
            self._failed(save_failed(failed, exc), periodic=self.saving_periodic)
            return False
        if self.async_queue.get_num_unfinalized_calls() == 0:
            self.saving = None
            self.failed = 0
            self.progress.saved_in_background(self.saving_iteration)
        return True

    def write(
        self,
        *,
        iteration: int,
        consumed_samples: int,
        chunks: list[torch.nn.Module],
        optimizer: Any,
        scheduler: Any,
        identity: RunIdentity | None,
        periodic: bool,
    ) -> bool:
        """Save a checkpoint of ``iteration``; returns whether it was written (or, in the background, started).
        ``periodic``: a --save-interval save, which may fail once without ending the run."""
        assert self.cfg.run.save
        self.finish()  # the next save must see the last one tracked
        try:
            path = checkpointing.save_checkpoint(
                async_queue=self.async_queue,
                root=self.cfg.run.save,
                iteration=iteration,
                consumed_samples=consumed_samples,
                chunks=chunks,
                optimizer=optimizer,
                scheduler=scheduler,
                cfg=self.cfg,
                identity=identity,
            )
        except checkpointing.CheckpointError as exc:
            self._failed(exc, periodic=periodic)
            return False
        if self.async_queue is not None:
            self.saving, self.saving_iteration, self.saving_periodic = path, iteration, periodic
        else:
            self.failed = 0
        self.progress.saved(iteration, consumed_samples=consumed_samples, seq_length=self.cfg.model.seq_length,
                            background=self.async_queue is not None, now=time.time())  # fmt: skip
        if self.rank == 0:
            log.info("%s checkpoint %s", "writing in the background" if self.async_queue else "saved", path)
        return True

    def _failed(self, error: checkpointing.CheckpointError, *, periodic: bool) -> None:
        self.failed += 1
        cause = error.__cause__
        if isinstance(cause, RuntimeError) and distributed.lost_peers(cause) is not None:
            raise cause  # a peer died: nothing goes on (the training loop names it)
        if not periodic or self.failed > 1:
            raise error
        if not self._every_rank_failed():
            raise checkpointing.CheckpointError(
                f"{error}. Not every rank's save failed (one may still wait inside it), so training cannot go on"
            ) from error
        log.error("periodic save failed, training goes on (a second failure in a row stops the run): %s", error)

    def _every_rank_failed(self) -> bool:
        """Whether every rank saw this save fail: only then can they all go back to training together.

        Megatron-Core's save has steps that rank 0 takes alone (``metadata.json``, the integrity checks) and writes whose
        failure reaches the other ranks only in a later collective, so one rank may fail while another still waits
        inside the save. The ranks that failed meet in a barrier of their own group (gloo's monitored barrier,
        bounded by ``AGREE_S``); a rank that does not come means the run stops (exit 3) and is requeued."""
        if dist.get_world_size() == 1:
            return True
        if self._agreement is None:
            return False
        try:
            dist.monitored_barrier(group=self._agreement, timeout=timedelta(seconds=AGREE_S), wait_all_ranks=True)
        except RuntimeError:
            return False
        return True
