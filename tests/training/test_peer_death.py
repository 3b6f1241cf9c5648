"""A rank that dies mid-run under the ``srun`` launch (ranks started directly, no torchrun agent): the survivors
print one line naming the dead rank and its host, and exit 1, with no gloo traceback. The liveness beacons behind
it (``megatron_ext.training.distributed``) are tested on their own without a process group."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_ext.cli.launch import free_port
from megatron_ext.config.exit_codes import ExitCode
from megatron_ext.training.distributed import Peer, _Beacon, probe
from tests import waits
from tests.conftest import PRETRAIN, REPO, TINY_MODEL, _env
from tests.waits import READY_S, STOP_S


def _start(rank: int, port: int, log: Path) -> subprocess.Popen[bytes]:
    """Rank ``rank`` of 2 as ``LAUNCHER=srun`` starts it: RANK/WORLD_SIZE/MASTER_* in the environment."""
    env = _env() | {
        "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
    }  # fmt: skip
    args = [*TINY_MODEL, "--num-layers", "2", "--train-iters", "100000", "--log-interval", "1"]
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, str(PRETRAIN), *args], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO
        )


def _both_alive(ranks: list[subprocess.Popen[bytes]], logs: list[Path]) -> None:
    assert all(r.poll() is None for r in ranks), logs[0].read_text() + logs[1].read_text()


@pytest.mark.distributed
@pytest.mark.parametrize("victim", [1, 0], ids=["kill-rank-1", "kill-rank-0-the-store-host"])
def test_survivor_names_the_dead_rank_and_host_in_one_line(victim: int, tmp_path: Path) -> None:
    port = free_port()
    logs = [tmp_path / f"rank{rank}.log" for rank in range(2)]
    ranks = [_start(rank, port, logs[rank]) for rank in range(2)]
    survivor = ranks[1 - victim]
    try:
        # Training is running once the last rank (the logging one) reports an iteration.
        waits.wait_for(
            "training to start (rank 1 logging an iteration)",
            lambda: b"iteration" in logs[1].read_bytes(),
            timeout=READY_S,
            check=lambda: _both_alive(ranks, logs),
            state=lambda: "\n".join(f"--- rank {rank} ---\n{waits.tail(log)}" for rank, log in enumerate(logs)),
        )
        ranks[victim].send_signal(signal.SIGKILL)
        ranks[victim].wait(timeout=STOP_S)
        try:
            survivor.wait(timeout=READY_S)  # a guard against a hang, not a measurement
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"rank {1 - victim} did not stop in {READY_S} s after rank {victim} died:\n{logs[1 - victim].read_text()}"
            )
    finally:
        for r in ranks:
            if r.poll() is None:
                r.kill()
                r.wait(timeout=STOP_S)
    output = logs[1 - victim].read_text()
    assert survivor.returncode == ExitCode.ERROR, output
    errors = [line for line in output.splitlines() if "error" in line.lower()]
    named = f"error: rank {victim} on host {socket.gethostname()} (pid {ranks[victim].pid}) died; "
    assert len(errors) == 1 and named in errors[0], output
    assert "Traceback" not in output and "Connection reset" not in output, output


def _peer(beacon: _Beacon, pid: int) -> Peer:
    return Peer(rank=beacon.rank, host="here", address="127.0.0.1", port=beacon.port, pid=pid)


@pytest.mark.unit
def test_a_beacon_tells_up_leaving_and_gone_apart() -> None:
    beacon = _Beacon(3, socket.AF_INET, "127.0.0.1")
    peer = _peer(beacon, os.getpid())
    try:
        assert probe(peer) == "up"
        # A survivor's notice: remembered, and the one that sent it is known to leave because of the loss.
        assert probe(peer, "gone 5,7 from 1") == "up"
        assert beacon.told_gone == {5, 7} and beacon.told_by == {1}
        beacon.leaving = True
        assert probe(peer) == "leaving"
        # Another process answering on that port (it was reused) is not that rank.
        assert probe(_peer(beacon, os.getpid() + 1)) == "gone"
    finally:
        beacon.close()
    assert probe(peer, timeout=1) == "gone"  # closed: connection refused


@pytest.mark.unit
def test_a_peer_that_accepts_but_does_not_answer_is_alive() -> None:
    """A busy process's kernel still accepts the connection: that process holds its socket, so it lives."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        peer = Peer(rank=0, host="here", address="127.0.0.1", port=silent.getsockname()[1], pid=1)
        assert probe(peer, timeout=1) == "up"
