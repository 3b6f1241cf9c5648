"""How long the tests wait, in one place, and the waits that fail saying what they waited for.

Every subprocess, poll and SLURM wait in tests/ is bounded by one of the constants below (tests/test_house_rules.py
checks that no ``subprocess.run``, ``.wait`` or ``.communicate`` goes without a timeout). The bounds are generous:
several times what a quiet machine needs, since a shared CI runner (two CPU-bound neighbours on two cores) makes
everything two to three times slower. A test that runs past one has hung, and it then says what it waited for and
what is known of it (the command, the tail of its output or log) instead of a bare ``TimeoutExpired``.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

QUICK_S = 120
"""A short command to finish: a tool's ``--help``, a dry run, a recipe's validation, an import probe, the calculator,
a SLURM client (sbatch, scontrol, sinfo). Under 10 s on a quiet machine, most under 1 s."""

RUN_S = 900
"""A training, preprocessing, conversion, export or demo run, or a SLURM job, to finish. Seconds to a minute or two
on a quiet machine (the README demo is the longest)."""

READY_S = 300
"""A running process or service to get somewhere: training to log its first iterations or save, a tool to stage its
output, a signalled run to save and exit, a survivor to notice a dead peer, the SLURM daemons to come up, a job to
be requeued. Under a minute on a quiet machine."""

STOP_S = 60
"""A process to go once it was killed or terminated (with its children), a cleanup command (umount, scancel) to
finish. A second or two on a quiet machine."""

TAIL_CHARS = 4000
"""How much of an output or log a failure shows (its end)."""

T = TypeVar("T")


def tail(text: str | bytes | Path | None, chars: int = TAIL_CHARS) -> str:
    """The end of ``text`` (or of the file it names), for a failure message."""
    if isinstance(text, Path):
        text = text.read_bytes() if text.exists() else f"({text} does not exist)"
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    if not text:
        return "(nothing)"
    return text if len(text) <= chars else "…" + text[-chars:]


def kill_tree(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL ``proc`` and every process it started, and reap it. By process tree, not group: torchrun starts
    each worker in a session of its own."""
    import psutil

    family: list[psutil.Process] = []
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(proc.pid)
        family = [root, *root.children(recursive=True)]
    for p in family:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(family, timeout=STOP_S)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=STOP_S)


def run(
    cmd: Sequence[str | Path], *, timeout: float, check: bool = False, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)`` that fails the test
    instead: past ``timeout`` the command and every process it started are killed, and the test fails naming the
    command, the bound and the tail of what it printed. With ``check`` a non-zero exit fails it the same way."""
    args = [str(c) for c in cmd]
    shown = " ".join(args)
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    except BaseException:
        kill_tree(proc)
        raise
    if timed_out:
        kill_tree(proc)
        out, err = "", ""
        # A process that escaped the kill (double-forked) may still hold the pipes: read what came, briefly.
        with contextlib.suppress(subprocess.TimeoutExpired, ValueError):
            out, err = proc.communicate(timeout=STOP_S)
        pytest.fail(
            f"did not finish in {timeout:g} s (killed with its processes): {shown}\n"
            f"--- stdout ---\n{tail(out)}\n--- stderr ---\n{tail(err)}"
        )
    if check and proc.returncode != 0:
        pytest.fail(f"exited {proc.returncode}: {shown}\n--- stdout ---\n{tail(out)}\n--- stderr ---\n{tail(err)}")
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def wait_for[T](
    what: str,
    done: Callable[[], T],
    *,
    timeout: float,
    every: float = 0.1,
    check: Callable[[], object] | None = None,
    state: Callable[[], str] | None = None,
) -> T:
    """Poll ``done()`` every ``every`` s until it returns something true, and return that. Between polls ``check()``
    runs, to assert that it can still happen (the process is alive, the daemons are up). Past ``timeout`` the test
    fails with ``what`` and ``state()``: what is known of what was awaited (a log's tail, a job's record)."""
    deadline = time.monotonic() + timeout
    while not (result := done()):
        if check is not None:
            check()
        if time.monotonic() > deadline:
            known = f"\n{state()}" if state is not None else ""
            pytest.fail(f"waited {timeout:g} s for {what}, in vain{known}")
        time.sleep(every)
    return result


def wait_exit(proc: subprocess.Popen[Any], what: str, *, timeout: float, log: Path | None = None) -> int:
    """``proc``'s exit code once it exits. Past ``timeout`` it is killed with its processes and the test fails with
    ``what`` (what the process was to do before exiting) and the tail of its ``log``."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        return proc.wait(timeout=timeout)
    kill_tree(proc)
    shown = f"\n--- {log} ---\n{tail(log)}" if log is not None else ""
    pytest.fail(f"{what}: still running after {timeout:g} s (killed), pid {proc.pid}: {proc.args}{shown}")
