"""The launcher passes the planned-stop signals to its workers only, survives a burst of them, and exits with
the code the workers chose (``megatron_ext/cli/launch.py``)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from megatron_ext.cli.launch import chosen_exit_code
from megatron_ext.config.exit_codes import SIGNAL_BASE, ExitCode
from tests import waits
from tests.conftest import REPO, _env
from tests.waits import STOP_S

pytestmark = pytest.mark.unit

# Stands in for torchrun under the launcher: the launcher's handler, one worker (a direct child) and the
# worker's own helper (a grandchild). Each records the signals it receives in a file named by argv.
RECORDER = """
import signal, sys, time
def record(signum, frame):
    with open(sys.argv[1], "a") as out:
        out.write(f"{signum}\\n")
for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(sig, record)
"""
HELPER = RECORDER + "print('ready', flush=True)\nwhile True: time.sleep(0.01)\n"
WORKER = (
    RECORDER
    + "import subprocess\n"
    + "helper = subprocess.Popen([sys.executable, '-c', sys.argv[3], sys.argv[2]], stdout=subprocess.PIPE, text=True)\n"
    + "helper.stdout.readline(); print('ready', flush=True)\n"
    + "while True: time.sleep(0.01)\n"
)
LAUNCHER = """
import signal, subprocess, sys, time
from megatron_ext.cli import launch
for sig in launch.PLANNED_STOP_SIGNALS:
    signal.signal(sig, launch._forward_to_workers)
worker = subprocess.Popen([sys.executable, "-c", *sys.argv[1:]], stdout=subprocess.PIPE, text=True)
worker.stdout.readline()
print("ready", flush=True)
while True:
    time.sleep(0.01)  # torchrun's monitor loop, where the handler runs
"""


def test_a_burst_of_stop_signals_reaches_the_worker_only_and_leaves_the_launcher_running(tmp_path: Path) -> None:
    """Before: the handler imported psutil, and a second signal during that import (the resilience test sends
    two) met a partially initialised module: the launcher died with an AttributeError and the job exit 1."""
    worker_log, helper_log, errors = tmp_path / "worker", tmp_path / "helper", tmp_path / "stderr"
    command = [sys.executable, "-c", LAUNCHER, WORKER, str(worker_log), str(helper_log), HELPER]
    with open(errors, "w") as stderr:
        # A group of its own, so that the worker and its helper end with the test even if the launcher died.
        launcher = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=_env(), cwd=REPO, start_new_session=True
        )

    def running() -> None:
        assert launcher.poll() is None, f"the launcher died:\n{waits.tail(errors)}"

    try:
        assert launcher.stdout is not None
        assert launcher.stdout.readline() == "ready\n", waits.tail(errors)
        for _ in range(40):  # spread over 0.2 s: signals that arrive together are delivered once
            launcher.send_signal(signal.SIGUSR1)
            time.sleep(0.005)
        waits.wait_for("the worker to receive the signal", worker_log.exists, timeout=STOP_S, check=running)
        running()
        assert set(worker_log.read_text().split()) == {str(int(signal.SIGUSR1))}
        assert not helper_log.exists(), "the worker's helper received a signal meant for the worker"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=STOP_S)


@pytest.mark.parametrize(
    ("codes", "expected"),
    [
        ([75, -15], ExitCode.SAVED_AND_STOPPED),  # one worker saved and stopped; torchrun then ended the other
        ([75, 75], ExitCode.SAVED_AND_STOPPED),
        ([75, 3], ExitCode.ERROR),  # the workers disagree
        ([-15, -15], SIGNAL_BASE + signal.SIGTERM),  # no --exit-signal-handler: they died of the signal
        ([-15, -9], ExitCode.ERROR),
    ],
)
def test_the_exit_code_is_the_one_the_workers_chose(codes: list[int], expected: int) -> None:
    assert chosen_exit_code(codes) == expected
