"""A benchmark's ``pretrain_gpt.py`` ranks, forked from the rank server of the pytest process that runs it.

``bench/train_throughput.py`` (and through it the GPU check and the calibration benchmark) starts its runs with
the command in ``BENCH_PRETRAIN_LAUNCHER`` when that is set, in place of a plain interpreter or the launcher::

    python -m tests.rank_client --nproc N SCRIPT ARGS...

This client asks the server at ``MEGATRON_EXT_RANK_SERVER`` (``tests/rank_server.py``, which the test starts) for
``N`` ranks with the variables ``LAUNCHER=srun`` gives them (``RANK``, ``WORLD_SIZE``, a free port), its own
environment, working directory, stdout and stderr, as ``spawn_ranks`` does; it waits for them and exits with the
code the launcher would (``chosen_exit_code``). It imports neither torch nor Megatron-Core: it costs what a bare
interpreter costs, where a fresh rank costs about 3 s of CPU more than a forked one.

The ranks are the server's children, not this client's: each holds the read end of a pipe whose write end only
this client holds, and kills itself when that pipe closes, that is when this client ends, however it ends (a GPU
check step past its budget is killed with its process group, this client included). A failed rank leaves the
others waiting in a collective: they are killed 30 s later, as torchrun and ``spawn_ranks`` do.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from megatron_ext.cli.launch import chosen_exit_code
from megatron_ext.training.ports import free_port
from tests.rank_server import _MESSAGE, ForkedRank
from tests.waits import RUN_S, STOP_S

SERVER_VARIABLE = "MEGATRON_EXT_RANK_SERVER"
"""The rank server's socket."""

LAUNCHER_VARIABLE = "BENCH_PRETRAIN_LAUNCHER"
"""What ``bench/train_throughput.py``'s ``pretrain_command`` reads (the name is that module's)."""

FAILED_GRACE_S = 30
"""How long the other ranks may run after one failed."""


def start_ranks(server: str, script: Path, args: list[str], *, nproc: int, watch: int) -> list[ForkedRank]:
    """``nproc`` ranks of ``script args``, each holding ``watch`` (the read end of this client's pipe)."""
    port = str(free_port())
    ranks = []
    for rank in range(nproc):
        env = dict(os.environ) | {
            "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
        }  # fmt: skip
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        conn.connect(server)
        request = {"script": str(script), "args": args, "env": env, "cwd": os.getcwd()}
        socket.send_fds(conn, [json.dumps(request).encode()], [sys.stdout.fileno(), sys.stderr.fileno(), watch])
        ranks.append(ForkedRank(conn, json.loads(conn.recv(_MESSAGE))["pid"]))
    return ranks


def wait_ranks(ranks: Sequence[Any], *, timeout: float, poll_s: float = 0.02) -> bool:
    """Wait for the ranks (``Popen``-like: ``poll``, ``kill``, ``wait``, ``returncode``), as a launcher does: past
    ``timeout``, or ``FAILED_GRACE_S`` after one failed (the others wait in a collective), the ranks still running
    are killed. True when they all ended by themselves before the timeout."""
    deadline = time.monotonic() + timeout
    failed_at: float | None = None
    while any(r.poll() is None for r in ranks):
        now = time.monotonic()
        if failed_at is None and any((r.returncode or 0) != 0 for r in ranks):
            failed_at = now
        if now > deadline or (failed_at is not None and now > failed_at + FAILED_GRACE_S):
            for r in ranks:
                if r.poll() is None:
                    r.kill()
            for r in ranks:
                r.wait(timeout=STOP_S)
            return now <= deadline
        time.sleep(poll_s)
    return True


def exit_code(ranks: Sequence[Any]) -> int:
    """The ranks' exit code as the launcher reports it (``chosen_exit_code`` of the failed ones)."""
    failed = [r.returncode for r in ranks if r.returncode != 0]
    return chosen_exit_code(x for x in failed if x is not None) if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("script", type=Path)
    parser.add_argument("args", nargs=argparse.REMAINDER)
    given = parser.parse_args(argv)
    server = os.environ.get(SERVER_VARIABLE)
    if not server:
        parser.error(f"{SERVER_VARIABLE} is not set: a test starts this client, with its rank server's socket")
    sys.stdout.flush()
    watch, held = os.pipe()  # ``held`` stays open in this process only, until it ends
    ranks = start_ranks(server, given.script.resolve(), given.args, nproc=given.nproc, watch=watch)
    os.close(watch)
    if not wait_ranks(ranks, timeout=RUN_S):
        print(f"rank_client: the ranks did not finish in {RUN_S:g} s (killed)", file=sys.stderr)
    os.close(held)
    return exit_code(ranks)


if __name__ == "__main__":
    sys.exit(main())
