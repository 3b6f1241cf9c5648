"""Stopping early without losing work: signals, time limits, exit codes.

Every rank checks, after each iteration, whether the run should stop: a
signal arrived on *any* rank (SIGTERM, SIGUSR1 or SIGUSR2 with
``--exit-signal-handler``), the *longest*-running rank passed
``--exit-duration-in-mins``, or ``--exit-interval`` was reached. One
all-reduce (MAX) makes the decision identical everywhere, so all ranks save
the same checkpoint and leave together with :attr:`ExitCode.SAVED_AND_STOPPED`,
which a recipe can answer by requeueing the job.

Exit codes of ``pretrain_gpt.py`` (kept through ``python -m megatron_ext.cli.launch``):

======  ==================================================================
0       training finished (``--train-iters`` reached)
1       an unexpected error
2       invalid configuration or layout (nothing was started)
3       a checkpoint could not be used (missing, corrupted, wrong shape)
4       too many consecutive non-finite losses (``--max-consecutive-skipped``)
75      stopped early with a checkpoint saved (signal, time limit, exit
        interval): run the same command again to continue (EX_TEMPFAIL);
        without ``--save`` such a stop exits 0 (nothing to continue from)
128+N   (launcher only) the workers died of signal N: 143 for a SIGTERM
        without ``--exit-signal-handler`` (with it they save and exit 75)
======  ==================================================================
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from types import FrameType

import torch
import torch.distributed as dist

HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


STEP_DELAY_VARIABLE = "MEGATRON_EXT_STEP_DELAY_S"
"""A test seam: seconds every rank sleeps before each training step, so that a run lasts without keeping the CPU
busy (``tests/recipes/test_slurm.py``'s time-limit job trains until SLURM's signal, a minute in)."""


def step_delay_s() -> float:
    """``MEGATRON_EXT_STEP_DELAY_S``, 0 when unset."""
    return float(os.environ.get(STEP_DELAY_VARIABLE) or 0)


class NonFiniteLossError(RuntimeError):
    """Training produced too many non-finite losses in a row."""


class SignalFlag:
    """Remembers that one of the handled signals arrived; never interrupts.

    A handler that only sets a flag cannot corrupt a save in progress, however
    many signals follow the first.
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, object] = {}

    def install(self) -> None:
        for sig in HANDLED_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)  # type: ignore[arg-type]
        self._previous.clear()

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum


@dataclass(frozen=True)
class StopReason:
    message: str


class StopPolicy:
    """Decides, identically on every rank, whether to stop after an iteration."""

    def __init__(
        self,
        *,
        exit_interval: int,
        exit_duration_minutes: float | None,
        signal_flag: SignalFlag | None,
        device: torch.device,
        start_time: float | None = None,
    ) -> None:
        self.exit_interval = exit_interval
        self.exit_duration_minutes = exit_duration_minutes
        self.signal_flag = signal_flag
        self.device = device
        self.start_time = time.monotonic() if start_time is None else start_time

    def check(self, iteration: int) -> StopReason | None:
        state = torch.tensor(
            [
                float(self.signal_flag.received or 0) if self.signal_flag else 0.0,
                (time.monotonic() - self.start_time) / 60.0,
            ],
            dtype=torch.float64,
            device=self.device,
        )
        if self.signal_flag is not None or self.exit_duration_minutes is not None:
            dist.all_reduce(state, op=dist.ReduceOp.MAX)
        signum, minutes = int(state[0].item()), float(state[1].item())
        if signum:
            return StopReason(f"received {signal.Signals(signum).name}")
        if self.exit_duration_minutes is not None and minutes >= self.exit_duration_minutes:
            return StopReason(f"--exit-duration-in-mins {self.exit_duration_minutes:g} reached ({minutes:.2f} min)")
        if self.exit_interval > 0 and iteration % self.exit_interval == 0:
            return StopReason(f"--exit-interval {self.exit_interval} reached")
        return None
