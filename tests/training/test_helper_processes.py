"""A rank's helper processes leave the planned-stop signals to the rank and end when it ends, kill -9 included
(``megatron_ext/training/helper_processes.py``), and the one private name of Megatron-Core it sets still works."""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests import waits
from tests.conftest import REPO, _env
from tests.waits import QUICK_S, STOP_S

pytestmark = pytest.mark.unit

# A stand-in for a rank: it installs the guard, starts a helper the way named by argv[1], prints the helper's
# pid and waits to be killed.
RANK = """
import multiprocessing, sys, time
from megatron_ext.training import helper_processes
helper_processes.install()
if sys.argv[1] == "forked":
    helper = multiprocessing.get_context("fork").Process(target=time.sleep, args=(600,))
    helper.start()
    pid = helper.pid
else:  # a synchronous save first (a thread queue), then an --async-save's: the server replaces it
    first = helper_processes.start_checkpoint_results_queue(across_processes=False)
    assert helper_processes.start_checkpoint_results_queue(across_processes=True) is not first
    pid = helper_processes._results_manager._process.pid
print(pid, flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("kind", ["forked", "results-queue-server"])
def test_a_helper_ignores_stop_signals_and_dies_with_its_rank(kind: str) -> None:
    rank = subprocess.Popen([sys.executable, "-c", RANK, kind], stdout=subprocess.PIPE, text=True, env=_env(), cwd=REPO)
    try:
        assert rank.stdout is not None
        helper = psutil.Process(int(rank.stdout.readline()))
        for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
            helper.send_signal(sig)
        time.sleep(0.5)
        assert helper.is_running() and helper.status() != psutil.STATUS_ZOMBIE, "a stop signal ended the helper"
        rank.kill()
        rank.wait(timeout=STOP_S)
        waits.wait_for("the helper to end with its rank", lambda: not _alive(helper), timeout=STOP_S)
    finally:
        if rank.poll() is None:
            rank.kill()
            rank.wait(timeout=STOP_S)


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_synchronous_save_keeps_its_results_in_the_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """No server process for a save that writes in the rank: a thread queue, kept for the next sync save."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    from megatron_ext.training import helper_processes

    monkeypatch.setattr(filesystem_async, "_results_queue", None)
    children = psutil.Process().children()
    given = helper_processes.start_checkpoint_results_queue(across_processes=False)
    assert isinstance(given, queue.Queue) and filesystem_async.get_write_results_queue() is given
    assert helper_processes.start_checkpoint_results_queue(across_processes=False) is given
    assert psutil.Process().children() == children


def test_megatron_core_takes_the_results_queue_it_is_given() -> None:
    """The contract behind ``start_checkpoint_results_queue``: Megatron-Core's writer asks
    ``filesystem_async.get_write_results_queue()``, which keeps a queue already set in ``_results_queue``."""
    probe = (
        "from megatron.core.dist_checkpointing.strategies import filesystem_async as f\n"
        "given = object(); f._results_queue = given\n"
        "assert f.get_write_results_queue() is given\n"
        "import inspect; assert 'get_write_results_queue(' in inspect.getsource(f.FileSystemWriterAsync)\n"
    )
    proc = waits.run([sys.executable, "-c", probe], timeout=QUICK_S, env=_env(), cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]


WATCHED = """
import multiprocessing, os, signal, time
from megatron_ext.training import helper_processes
helper_processes.install()
with helper_processes.helpers_watched("a save"):
    writer = multiprocessing.get_context("fork").Process(target=time.sleep, args=(600,))
    writer.start()
    os.kill(writer.pid, signal.SIGKILL)
    time.sleep(600)  # Megatron-Core waiting for the writer's result
"""


def test_a_rank_whose_save_lost_a_helper_exits_instead_of_waiting_for_ever() -> None:
    """Before: a checkpoint writer killed by a signal (found by the SLURM soak) left the rank waiting in
    Megatron-Core's queue for ever, and the job hung until its time limit."""
    proc = waits.run([sys.executable, "-c", WATCHED], timeout=QUICK_S, env=_env(), cwd=REPO)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "was killed by SIGKILL during a save, which would wait for it for ever: this rank exits" in proc.stderr
