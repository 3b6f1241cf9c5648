"""A training rank's helper processes: they leave planned stops to the rank and never outlive it.

A rank starts helpers that Megatron-Core and torch create for it: the forked
processes that write a checkpoint's files (and, with ``--async-save``, the
one that saves in the background), the spawned server of Megatron-Core's
write-results queue, Python's resource tracker, and data-loader workers.

**Planned stops are the rank's.** ``torchrun`` sends SIGTERM to each
worker's whole process group, ``scancel`` and SLURM's ``--signal`` reach
every process of a job step. A helper that died of the signal would break
the very save the stop asks for (the first save's results-queue server
died of SIGUSR1, and the next save wrote into its closed pipe: ``EPIPE``).
So every helper ignores SIGTERM, SIGUSR1 and SIGUSR2; the rank finishes its
iteration, saves and exits 75 (``resilience``).

**Nothing outlives its rank.** Each helper asks the kernel for SIGKILL when
the process that started it ends, however it ends (``PR_SET_PDEATHSIG``;
kill -9 included), and leaves at once if that process is already gone.
Without it a killed rank's results-queue server lived on (about 280 MB) on
nodes without SLURM's cgroup cleanup. (That server imports torch whatever it
imports itself: the write results it unpickles are
``torch.distributed.checkpoint`` objects.)

How each kind is reached:

* forked helpers (checkpoint writers, the background saver, data-loader
  workers): ``os.register_at_fork`` (Python's public hook) runs
  :func:`become_helper` in every child the rank forks;
* the results-queue server, which Megatron-Core spawns (a new interpreter,
  where no fork hook runs) on its first save, and which only an
  ``--async-save`` needs (a synchronous save's results stay in the rank: a
  thread queue): the rank starts it itself,
  with the stop signals blocked until :func:`become_helper`, its
  initializer, ignores them, and hands its queue to
  Megatron-Core (:func:`start_checkpoint_results_queue`; the one private
  name it sets, ``filesystem_async._results_queue``, is listed in ``mcore_private`` and checked by
  ``tests/training/test_helper_processes.py``);
* Python's resource tracker (spawned, it ignores SIGINT and SIGTERM by
  itself): started early with SIGUSR1 and SIGUSR2 blocked, which a new
  interpreter inherits.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import queue
import signal
import sys
import threading
from collections.abc import Iterator
from multiprocessing.managers import SyncManager
from typing import Any

from megatron_ext.config.exit_codes import ExitCode
from megatron_ext.training.resilience import HANDLED_SIGNALS

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
"""prctl(2): the signal this process gets when its parent ends."""

_installed = False
_forking_pid = 0
"""The pid of the process that is forking (set just before each fork: the child's parent)."""
_results_manager: SyncManager | None = None


def become_helper(parent: int) -> None:
    """In a helper of process ``parent``: ignore the planned-stop signals and end with ``parent``."""
    for sig in HANDLED_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    # A spawned helper starts with them blocked (start_checkpoint_results_queue): ignored now, they may come.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED_SIGNALS)
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:
        # The parent ended before the request above was made: it will never fire.
        os._exit(1)


def data_loader_worker_init(parent: int, _worker_id: int) -> None:
    """A DataLoader's ``worker_init_fn`` (with ``parent`` bound): the worker is a helper of ``parent``."""
    become_helper(parent)


_mask_before_fork: set[int | signal.Signals] = set()


def _before_fork() -> None:
    # Blocked across the fork: the child inherits the mask, so a stop signal cannot reach it before it ignores
    # them (become_helper unblocks them then); the parent restores its own mask at once.
    global _forking_pid, _mask_before_fork
    _forking_pid = os.getpid()
    _mask_before_fork = signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED_SIGNALS)


def _after_fork_in_parent() -> None:
    signal.pthread_sigmask(signal.SIG_SETMASK, _mask_before_fork)


def _after_fork_in_child() -> None:
    become_helper(_forking_pid)


def install() -> None:
    """Make every process this rank forks from now on a helper, and start the resource tracker as one
    (idempotent; call it in the rank before anything forks or spawns)."""
    global _installed
    if _installed:
        return
    _installed = True
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
    from multiprocessing import resource_tracker

    # A spawned interpreter keeps the signal mask it was started with; the tracker itself unblocks only the
    # SIGINT and SIGTERM it ignores.
    usr = {signal.SIGUSR1, signal.SIGUSR2}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, usr)
    try:
        resource_tracker.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def start_checkpoint_results_queue(*, across_processes: bool) -> Any:
    """Give Megatron-Core's checkpoint writer its write-results queue before a save, and return it.

    A synchronous save writes in this rank (Megatron-Core's writer threads), so a thread queue carries its
    results (``across_processes=False``): no server process, no second interpreter importing torch. An
    ``--async-save`` writes in a forked process: its results cross processes through a manager's queue, whose
    server (a spawned interpreter) is started as a helper of this rank, once; Megatron-Core would otherwise
    spawn an unguarded one. A thread queue set by an earlier synchronous save is replaced then."""
    global _results_manager
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    current = filesystem_async._results_queue
    if not across_processes:
        if current is None:
            filesystem_async._results_queue = queue.Queue()
    elif current is None or isinstance(current, queue.Queue):
        manager = SyncManager(ctx=multiprocessing.get_context("spawn"))
        # A new interpreter takes a second or more to reach its initializer: it starts with the stop signals
        # blocked (a spawned process keeps the signal mask), so one that comes meanwhile cannot kill it.
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED_SIGNALS)
        try:
            manager.start(initializer=become_helper, initargs=(os.getpid(),))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        _results_manager = manager  # kept: the server lives as long as its manager object
        filesystem_async._results_queue = manager.Queue()
    return filesystem_async._results_queue


WATCH_EVERY_S = 0.5
"""How often ``helpers_watched`` looks at the rank's helpers."""


def _killed_child() -> tuple[int, str] | None:
    """A child of this process that a signal ended, as (pid, signal name), without reaping it (WNOWAIT)."""
    import psutil

    for child in psutil.Process().children():
        try:
            info = os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            continue
        if info is not None and info.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
            return child.pid, signal.Signals(info.si_status).name
    return None


@contextlib.contextmanager
def helpers_watched(what: str) -> Iterator[None]:
    """While the block runs, end this rank when one of its helpers is killed by a signal (the OOM killer, a
    kill -9). Megatron-Core's checkpoint writers report through a queue that waits for every writer: one that
    was killed leaves the save, and the run, waiting for ever. Ending the rank instead ends the job, which the
    recipes requeue from the last published checkpoint (the unfinished save is a partial one: removed then)."""
    done = threading.Event()

    def watch() -> None:
        while not done.wait(WATCH_EVERY_S):
            killed = _killed_child()
            if killed is not None:
                pid, name = killed
                log.error(
                    "helper process %d was killed by %s during %s, which would wait for it for ever: this rank "
                    "exits (code %d) so that the job ends and resumes from the last published checkpoint",
                    pid, name, what, ExitCode.ERROR,
                )  # fmt: skip
                logging.shutdown()
                os._exit(ExitCode.ERROR)  # the recipes requeue after it

    watcher = threading.Thread(target=watch, name="helpers-watched", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
