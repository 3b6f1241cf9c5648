"""``--log-progress``: Megatron-LM's ``progress.txt`` under ``--save``, line for line.

Megatron-LM (``megatron/training/utils.py`` ``append_to_progress_log``, ``training.py``
``compute_throughputs_and_append_to_progress_log`` and ``get_start_time_from_progress_log``) appends from
rank 0 one tab-separated line per event: the time, ``Job ID: $SLURM_JOB_ID``, ``# GPUs: world size``, then
``Starting job``, or after each save ``Saved checkpoint`` (``Saving async checkpoint`` when it is written in
the background, then ``Saved async checkpoint``) with the iteration, this job's and the cumulative
throughput (TFLOP/s per GPU since the first job of the same world size), the floating-point operations so far
and the tokens so far in billions. The operations so far are the consumed samples times the model's
operations per sample (Megatron-LM keeps the same sum in its checkpoints).
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

FILENAME = "progress.txt"
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


def _line(event: str, *, world_size: int, now: datetime) -> str:
    job = os.environ.get("SLURM_JOB_ID", "")
    return f"{now.strftime(TIME_FORMAT)}\tJob ID: {job}\t# GPUs: {world_size}\t{event}\n"


def append(save: str | Path, event: str, *, world_size: int, now: datetime | None = None) -> None:
    """One line in ``save``/progress.txt (call on rank 0)."""
    path = Path(save) / FILENAME
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(_line(event, world_size=world_size, now=now or datetime.now()))


def start_of_same_world_size(save: str | Path, world_size: int) -> tuple[datetime, float]:
    """When the first job of the current run of jobs with this world size started, and the operations done
    before it (the last ``Saved checkpoint`` line before it), as Megatron-LM reads them back."""
    start: tuple[datetime, float] | None = None
    latest = 0.0
    for line in (Path(save) / FILENAME).read_text(encoding="utf-8").splitlines():
        fields = line.strip().split("\t")
        if len(fields) < 4:
            continue
        if fields[3] == "Saved checkpoint" and len(fields) > 7:
            latest = float(fields[7].split(": ")[1])
        if int(fields[2].split(": ")[1]) != world_size:
            start = None  # another world size: the search starts again
            continue
        if fields[3] == "Starting job" and start is None:
            start = (datetime.strptime(fields[0], TIME_FORMAT), latest)
    if start is None:
        raise ValueError(f"{Path(save) / FILENAME} has no 'Starting job' line for {world_size} GPUs")
    return start


def saved_event(
    iteration: int,
    *,
    save: str | Path,
    world_size: int,
    flops_so_far: float,
    job_start_flops: float,
    job_seconds: float,
    tokens_so_far: int,
    background: bool,
    now: datetime | None = None,
) -> str:
    """The ``Saved checkpoint`` (or ``Saving async checkpoint``) event with its throughputs."""
    now = now or datetime.now()
    job = (flops_so_far - job_start_flops) / (max(job_seconds, 1e-9) * 1e12 * world_size)
    first_start, first_flops = start_of_same_world_size(save, world_size)
    elapsed = max((now - first_start).total_seconds(), 1e-9)
    cumulative = (flops_so_far - first_flops) / (elapsed * 1e12 * world_size)
    kind = "Saving async checkpoint" if background else "Saved checkpoint"
    return (
        f"{kind}\tIteration: {iteration}\tJob throughput: {job:.1f} TFLOP/s/GPU\t"
        f"Cumulative throughput: {cumulative:.1f} TFLOP/s/GPU\tFloating-point operations: {flops_so_far:.2e}\t"
        f"Tokens (in billions): {tokens_so_far / 10**9:.2f}"
    )


class ProgressLog:
    """The events of one job (rank 0 writes; a no-op without ``--log-progress`` and ``--save``)."""

    def __init__(self, *, save: str | None, enabled: bool, world_size: int, flops_per_sample: float) -> None:
        self.save = save if enabled else None
        self.world_size = world_size
        self.flops_per_sample = flops_per_sample
        self.started = 0.0
        self.start_flops = 0.0

    def start(self, consumed_samples: int, now: float) -> None:
        """``Starting job`` (``now``: ``time.time()``, when this job's throughput starts counting)."""
        self.started, self.start_flops = now, consumed_samples * self.flops_per_sample
        if self.save is not None:
            append(self.save, "Starting job", world_size=self.world_size)

    def saved(self, iteration: int, *, consumed_samples: int, seq_length: int, background: bool, now: float) -> None:
        if self.save is None:
            return
        event = saved_event(
            iteration,
            save=self.save,
            world_size=self.world_size,
            flops_so_far=consumed_samples * self.flops_per_sample,
            job_start_flops=self.start_flops,
            job_seconds=now - self.started,
            tokens_so_far=consumed_samples * seq_length,
            background=background,
        )
        append(self.save, event, world_size=self.world_size)

    def saved_in_background(self, iteration: int) -> None:
        if self.save is not None:
            append(self.save, f"Saved async checkpoint\tIteration: {iteration}", world_size=self.world_size)
