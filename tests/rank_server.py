"""pretrain_gpt.py's ranks forked from one process that has already imported what a rank imports.

A rank spends about 3 s of CPU importing torch, Megatron-Core (which imports TensorBoard and Triton) and
this package before its first line of work, and the suite starts some 300 of them: on 2 cores that is most of
its time. ``RankServer`` starts ``python -m tests.rank_server`` once per pytest process; the server imports those
modules (``PREIMPORTED``) and waits. For each rank it forks: the child takes the rank's stdout and stderr (file
descriptors passed over the socket), working directory, environment and arguments, and runs pretrain_gpt.py as
``__main__``, exactly as ``python pretrain_gpt.py`` would from there on, to its exit (``_exit``). The server
reports the child's exit status.

Each rank is still a process of its own, with its own life: it is killed, signalled and exits as a plain one;
its helper processes are its own children. What differs from a fresh interpreter: the modules above are imported
before the rank's environment is set (a variable read at import time by torch or Megatron-Core takes the suite's
value); at its end a rank does what the interpreter does at exit but does not free every module's objects
(``_exit``: in a forked child that copies every page it touches); and every rank shares the server's string-hash
seed (a fresh interpreter draws its own), so an order that depends on string hashing is the same on every rank
here. Tests whose subject is the process start (the launcher,
signals through torchrun, the SLURM recipes, the peer-death tests) start plain interpreters; so does every test
when ``MEGATRON_EXT_FORKED_RANKS=0``.

The benchmarks a test runs (the GPU check's CPU rehearsal, the calibration benchmark) have their ranks forked
here too: ``bench/train_throughput.py`` starts them with ``BENCH_PRETRAIN_LAUNCHER``, which the test sets to
``tests/rank_client.py``; such a rank also ends when that client ends (``_end_with_client``).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NoReturn

from tests.waits import READY_S, STOP_S, tail

PREIMPORTED = (
    "megatron_ext.training.entry",
    "megatron_ext.training.loop",
    "megatron_ext.training.model",
    "megatron_ext.training.datasets",
    "megatron_ext.training.attention",
    "megatron_ext.training.cpu_backend",
    "megatron_ext.training.norms",
    "megatron.core.models.gpt",
    "megatron.core.models.gpt.gpt_layer_specs",
    "megatron.core.transformer.attention",
    "megatron.core.datasets.helpers",
    "megatron.core.optimizer",
    "megatron.core.distributed",
    "megatron.core.pipeline_parallel.schedules",
    "megatron.core.dist_checkpointing.serialization",
    "megatron.core.datasets.gpt_dataset",
    "megatron.core.datasets.blended_megatron_dataset_builder",
    "megatron.core.models.mimo",
    "torch.utils.tensorboard",
    "torch._dynamo",
)
"""What the server imports before it forks: the modules a training rank imports (those import the rest)."""

ENABLED_VARIABLE = "MEGATRON_EXT_FORKED_RANKS"
"""``0``: start every rank as a plain interpreter."""

_MESSAGE = 1 << 20


@dataclass
class _Job:
    script: str
    args: list[str]
    env: dict[str, str]
    cwd: str
    fds: list[int]


def _serve(path: str) -> _Job:
    """The server's loop; in a forked child, returns that child's job."""
    for name in PREIMPORTED:
        importlib.import_module(name)
    # The imported objects move out of the collector's generations: a child's collections then skip them, and
    # do not touch (and so copy) the pages they share with the server.
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    sys.stderr.flush()
    waiting: dict[int, socket.socket] = {}
    while True:
        # The pytest process holds our stdin: its end (EOF) ends the server.
        readable, _, _ = select.select([listener, sys.stdin], [], [], 0.05)
        if sys.stdin in readable and not os.read(sys.stdin.fileno(), 1):
            return _Job("", [], {}, "", [])
        if listener in readable:
            conn, _ = listener.accept()
            data, fds, _, _ = socket.recv_fds(conn, _MESSAGE, 3)  # stdout, stderr, the client's pipe
            request = json.loads(data)
            pid = os.fork()
            if pid == 0:
                listener.close()
                conn.close()
                for other in waiting.values():
                    other.close()
                return _Job(request["script"], request["args"], request["env"], request["cwd"], fds)
            for fd in fds:
                os.close(fd)
            conn.send(json.dumps({"pid": pid}).encode())
            waiting[pid] = conn
        while waiting:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = waiting.pop(pid)
            with contextlib.suppress(OSError):  # the client may have gone
                conn.send(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode())
            conn.close()


def _run(job: _Job) -> None:
    """In the forked child: become ``python SCRIPT ARGS`` started in ``cwd`` with ``env``."""
    import runpy

    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(job.fds[0], 1)
    os.dup2(job.fds[1], 2)
    for fd in (devnull, *job.fds[:2]):
        os.close(fd)
    if len(job.fds) > 2:
        _end_with_client(job.fds[2])
    os.chdir(job.cwd)
    os.environ.clear()
    os.environ.update(job.env)
    with contextlib.suppress(ImportError):  # a fresh interpreter's global NumPy state is drawn from the OS
        import numpy

        numpy.random.seed()
    sys.argv = [job.script, *job.args]
    sys.path[0] = str(Path(job.script).parent)  # as `python SCRIPT` sets it
    try:
        runpy.run_path(job.script, run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = _exit_status(exc)
    except BaseException as exc:  # as the interpreter reports an uncaught exception
        sys.excepthook(type(exc), exc, exc.__traceback__)
        code = 130 if isinstance(exc, KeyboardInterrupt) else 1
    _exit(code)


def _end_with_client(watch: int) -> None:
    """Kill this rank when the client that asked for it ends (``tests/rank_client.py``): ``watch`` is the read end
    of a pipe whose write end only the client holds, and reads EOF then. The rank's own helpers end with it."""

    def wait_for_eof() -> None:
        while os.read(watch, 1):
            pass
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=wait_for_eof, name="end-with-client", daemon=True).start()


def _exit_status(exc: SystemExit) -> int:
    """The status ``python SCRIPT`` ends with on ``exc``: None is 0, an int itself, anything else is printed, 1."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _exit(code: int) -> NoReturn:
    """End as the interpreter ends, without its last step: what it does at exit (join the threads that are not
    daemons, run the ``atexit`` functions: logging's flush, ``weakref.finalize``, multiprocessing's clean-up),
    then stop. That last step frees every module's objects one by one; in a forked child each of those pages
    is shared with the server, so freeing them copies them first (bench/forked_exit_bench.py: a 2-rank run of
    2 iterations took 1.03 s, and 0.52 s ending this way, on a quiet machine)."""
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


class ForkedRank:
    """A rank the server forked, with what ``spawn_ranks`` uses of ``subprocess.Popen``."""

    def __init__(self, conn: socket.socket, pid: int) -> None:
        self.conn = conn
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self.conn], [], [], 0)[0]:
            data = self.conn.recv(_MESSAGE)
            # No message: the server ended before the rank (its own end kills nothing; the rank is lost).
            self.returncode = json.loads(data)["exit"] if data else -9
            self.conn.close()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
            time.sleep(0.02)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, 9)


class RankServer:
    """The server of this pytest process, started at its first rank and ended with the process."""

    def __init__(self, repo: Path, env: dict[str, str]) -> None:
        self.repo = repo
        self.env = env
        self.proc: subprocess.Popen[str] | None = None
        self.path = ""

    def _start(self) -> None:
        import tempfile

        folder = Path(tempfile.mkdtemp(prefix="ranks-"))
        atexit.register(self._stop, folder)
        self.path = str(folder / "server")
        log = folder / "server.log"  # what the imports print (each rank's own output goes to the rank's files)
        with log.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.rank_server", self.path],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=self.env, cwd=self.repo, text=True,
            )  # fmt: skip
        assert self.proc.stdout is not None
        # Its imports: seconds on a quiet machine.
        if not select.select([self.proc.stdout], [], [], READY_S)[0] or self.proc.stdout.readline().strip() != "ready":
            self.proc.kill()
            raise RuntimeError(
                f"the rank server did not start (exit code {self.proc.wait(timeout=STOP_S)}): {tail(log.read_text())}"
            )

    def _stop(self, folder: Path) -> None:
        """At the pytest process's end: the server sees its stdin close and ends; its folder goes."""
        if self.proc is not None and self.proc.stdin is not None:
            self.proc.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=STOP_S)
        shutil.rmtree(folder, ignore_errors=True)

    def address(self) -> str:
        """The server's socket, the server started if it is not running (``tests/rank_client.py`` connects to it)."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        return self.path

    def start(
        self, script: Path, args: list[str], *, env: dict[str, str], stdout: IO[Any], stderr: IO[Any]
    ) -> ForkedRank:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        conn.connect(self.address())
        request = {"script": str(script), "args": args, "env": env, "cwd": str(self.repo)}
        socket.send_fds(conn, [json.dumps(request).encode()], [stdout.fileno(), stderr.fileno()])
        return ForkedRank(conn, json.loads(conn.recv(_MESSAGE))["pid"])


def enabled(env: dict[str, str]) -> bool:
    return env.get(ENABLED_VARIABLE, "1") != "0"


if __name__ == "__main__":
    job = _serve(sys.argv[1])
    if job.script:
        _run(job)  # the child: from here on, pretrain_gpt.py as __main__, to its exit
