"""tests/waits.py: a wait that runs out fails the test saying what it waited for, and leaves nothing running."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests import waits

pytestmark = pytest.mark.unit

SLEEPER = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
    "print('started child', child.pid, flush=True)\n"
    "print('on stderr', file=sys.stderr, flush=True)\n"
    "time.sleep(600)\n"
)
"""A command that starts a process of its own, says so, and then hangs."""


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_command_past_its_bound_fails_with_its_output_and_is_killed_with_its_children() -> None:
    with pytest.raises(pytest.fail.Exception) as failed:
        waits.run([sys.executable, "-c", SLEEPER], timeout=3)
    message = str(failed.value)
    assert message.startswith(f"did not finish in 3 s (killed with its processes): {sys.executable} -c import")
    assert "started child" in message and "on stderr" in message
    child = int(message.split("started child ")[1].split()[0])
    waits.wait_for(f"pid {child} to be gone", lambda: _gone(child), timeout=waits.STOP_S)


def test_a_command_within_its_bound_is_a_completed_process() -> None:
    proc = waits.run([sys.executable, "-c", "import sys; print('out'); sys.exit(3)"], timeout=waits.QUICK_S)
    assert (proc.returncode, proc.stdout) == (3, "out\n")
    with pytest.raises(pytest.fail.Exception, match=r"^exited 3: .*\n--- stdout ---\nout\n"):
        waits.run([sys.executable, "-c", "import sys; print('out'); sys.exit(3)"], timeout=waits.QUICK_S, check=True)


def test_a_poll_past_its_bound_names_what_it_awaited_and_what_is_known() -> None:
    with pytest.raises(pytest.fail.Exception, match=r"waited 0.2 s for the moon, in vain\nno moon yet"):
        waits.wait_for("the moon", lambda: False, timeout=0.2, every=0.05, state=lambda: "no moon yet")
    assert waits.wait_for("a number", lambda: 7, timeout=0) == 7


def test_a_process_past_its_bound_is_killed_and_its_log_shown(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_text("last words\n")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with pytest.raises(pytest.fail.Exception, match=r"^the sleeper to wake: still running after 1 s \(killed\)"):
        waits.wait_exit(proc, "the sleeper to wake", timeout=1, log=log)
    assert proc.returncode is not None
    with pytest.raises(pytest.fail.Exception, match="last words"):
        waits.wait_exit(
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]), "x", timeout=0, log=log
        )
