"""Process groups and seeds: one entry point for CPU (gloo) and GPU (NCCL); and, when a rank dies, which one.

Naming a dead peer. Launched without torchrun's agent (``LAUNCHER=srun``: every
rank started directly, reading RANK/WORLD_SIZE/MASTER_ADDR), nobody watches the
ranks: when one dies, its peers only see their next collective with it fail
(gloo: "Connection reset by peer", naming an address and port but no rank).
So every rank of a multi-process run holds a *liveness beacon* for its whole
life: a TCP socket listening on the address it reaches the rendezvous host
from, which answers every connection with its rank and pid. At start-up the
ranks exchange (rank, host name, address, port, pid) once (one
``all_gather_object``). When a collective fails with a communication error,
the rank probes every peer's beacon: a closed port (connection refused or
reset) means that process is gone, whatever killed it (SIGKILL included: the
kernel closes the socket); no answer to the connection at all within
``PROBE_TIMEOUT_S`` means its node or network is down; an accepted connection,
answered or not, means it is alive (a busy process's kernel still accepts).
The probe needs nothing of the dead rank, nor the rendezvous store (which dies
with rank 0). A rank that has found a peer gone answers "leaving" from then on
and tells every peer still up which ranks died, before it exits: a rank that
fails only later, because that rank left (down a pipeline), then names the rank
that died first, not the ones that left because of it. Where no peer is gone
(a hang, a bug), the original error is left as it is.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime
import logging
import os
import random
import re
import socket
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from megatron_ext import notices
from megatron_ext.config.arguments import ConfigError
from megatron_ext.config.run_args import DEVICE_BACKENDS, backend_problem
from megatron_ext.config.runtime import serial_cuda_connections
from megatron_ext.parallel.layout import ParallelLayout
from megatron_ext.training.ports import free_port

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistributedContext:
    """Where this process sits in the grid."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    tp_rank: int
    pp_rank: int
    dp_rank: int

    @property
    def is_logging_rank(self) -> bool:
        """The last rank logs: it is on the last pipeline stage, where the loss is."""
        return self.rank == self.world_size - 1


def resolve_device(choice: str) -> torch.device:
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda was given but torch sees no CUDA device; use --device cpu")
    return torch.device(choice)


def world_size_from_env() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def initialize(
    *,
    layout: ParallelLayout,
    device_choice: str,
    seed: int,
    timeout_minutes: int = 10,
    backend_choice: str | None = None,
    tp_pp_dp_order: bool = False,
    pipeline_comm_backend: str | None = None,
) -> DistributedContext:
    """Create the process group and Megatron-Core's parallel state; seed every RNG.

    Works under torchrun / srun (env:// rendezvous) and as a single process
    without any launcher (a one-process group on a free local port).
    """
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    device = resolve_device(device_choice)
    if backend_choice is not None and (problem := backend_problem(backend_choice, device.type)):
        raise ConfigError(problem)  # --device auto resolved to the other device
    rank = int(os.environ.get("RANK", "0"))
    world_size = world_size_from_env()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if world_size != layout.world_size:
        raise RuntimeError(
            f"the layout was validated for world_size={layout.world_size} "
            f"but the launcher started {world_size} processes"
        )
    if device.type == "cpu":
        from megatron_ext.training import cpu_backend

        cpu_backend.enable()
        notices.install(device_type="cpu")  # and the warnings that apply only on GPUs
    else:
        _set_cuda_connections(layout)
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    backend = DEVICE_BACKENDS[device.type]
    if "MASTER_ADDR" not in os.environ:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    if not dist.is_initialized():
        dist.init_process_group(
            backend=backend,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(minutes=timeout_minutes),
        )
    if world_size > 1:
        _register_peers(rank)
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vp if layout.interleaved else None,
        context_parallel_size=layout.cp,
        distributed_timeout_minutes=timeout_minutes,
        # Megatron-LM's --use-tp-pp-dp-mapping and --pipeline-model-parallel-comm-backend.
        order="tp-pp-dp" if tp_pp_dp_order else "tp-cp-ep-dp-pp",
        # (On CPU, gloo's: the model build refuses the flag there, naming it.)
        pipeline_model_parallel_comm_backend=pipeline_comm_backend if device.type == "cuda" else None,
    )
    ctx = DistributedContext(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        device=device,
        tp_rank=parallel_state.get_tensor_model_parallel_rank(),
        pp_rank=parallel_state.get_pipeline_model_parallel_rank(),
        dp_rank=parallel_state.get_data_parallel_rank(),
    )
    # As Megatron-LM: different seeds per pipeline stage for initialisation;
    # the tracker derives the tensor-parallel dropout streams.
    stage_seed = seed + 100 * ctx.pp_rank
    random.seed(stage_seed)
    np.random.seed(stage_seed)
    torch.manual_seed(stage_seed)
    model_parallel_cuda_manual_seed(stage_seed)
    return ctx


def _set_cuda_connections(layout: ParallelLayout) -> None:
    """One hardware work queue when TP communicates inside every layer.

    Why: ``config.runtime.serial_cuda_connections``. Must be set before the
    CUDA context exists; a value the user chose is kept.
    """
    if (
        serial_cuda_connections(tensor_model_parallel_size=layout.tp)
        and "CUDA_DEVICE_MAX_CONNECTIONS" not in os.environ
    ):
        os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
        log.info("CUDA_DEVICE_MAX_CONNECTIONS=1 (tensor parallelism overlaps its communication with GEMMs)")


def destroy() -> None:
    """Tear the process groups down and close this rank's liveness beacon."""
    from megatron.core import parallel_state

    beacon = _beacon
    if beacon is not None and beacon.leaving:
        # A peer is gone: a failed collective may leave a group that cannot be torn down cleanly, and the
        # process is about to end anyway.
        with contextlib.suppress(Exception):
            parallel_state.destroy_model_parallel()
            if dist.is_initialized():
                dist.destroy_process_group()
    else:
        parallel_state.destroy_model_parallel()
        if dist.is_initialized():
            dist.destroy_process_group()
    if beacon is not None:
        beacon.close()


PROBE_TIMEOUT_S = 5.0
"""How long a probe waits for a peer's node to accept a connection before calling it unreachable."""
ANSWER_TIMEOUT_S = 1.0
"""How long either end of an accepted beacon connection waits for the other's line."""

_COMMUNICATION_FAILURE = re.compile(
    r"gloo|nccl|connection (reset|closed|refused)|broken pipe|socket|peer|timed out", re.IGNORECASE
)
"""What a collective's error says when the other end went away (gloo raises a plain RuntimeError)."""


@dataclass(frozen=True)
class Peer:
    """Where a rank runs and where its liveness beacon listens."""

    rank: int
    host: str
    address: str
    port: int
    pid: int

    def __str__(self) -> str:
        return f"rank {self.rank} on host {self.host} (pid {self.pid})"


class _Beacon:
    """This process's liveness beacon: a listening socket whose thread answers each request line with
    "RANK PID up|leaving". Requests: "probe", or "gone R,R from S" (rank S found ranks R gone: remembered, so
    that a rank which fails later, once S has exited too, still knows which rank died first)."""

    def __init__(self, rank: int, family: socket.AddressFamily, address: str) -> None:
        self.rank = rank
        self.leaving = False
        """Set once this rank has found a peer gone: its peers must not count it among the dead."""
        self.told_gone: set[int] = set()
        self.told_by: set[int] = set()
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind((address, 0))
        self.sock.listen(socket.SOMAXCONN)  # every peer may probe at once
        self.port = int(self.sock.getsockname()[1])
        self._closed = False
        threading.Thread(target=self._serve, name="liveness-beacon", daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            with conn, contextlib.suppress(OSError, ValueError):
                conn.settimeout(ANSWER_TIMEOUT_S)
                request = _read_line(conn).split()
                if len(request) == 4 and request[0] == "gone" and request[2] == "from":
                    self.told_gone |= {int(r) for r in request[1].split(",")}
                    self.told_by.add(int(request[3]))
                conn.sendall(f"{self.rank} {os.getpid()} {'leaving' if self.leaving else 'up'}\n".encode())

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept thread
            self.sock.close()


def _read_line(conn: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n") and len(data) < 4096:
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace")


_beacon: _Beacon | None = None
_peers: list[Peer] = []


def _forget_beacon_in_child() -> None:
    """A forked child (a data-loader worker) must not hold the beacon open: a peer would think the rank alive."""
    global _beacon
    if _beacon is not None:
        with contextlib.suppress(OSError):
            _beacon.sock.close()
        _beacon = None


os.register_at_fork(after_in_child=_forget_beacon_in_child)


def _reachable_address() -> tuple[socket.AddressFamily, str]:
    """The address family and local address this host reaches MASTER_ADDR from: where peers can reach it too.

    (A UDP "connection" only asks the kernel for the route; no packet is sent.)"""
    host, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "29500"))
    with contextlib.suppress(OSError):
        for family, kind, proto, _, target in socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM):
            with socket.socket(family, kind, proto) as probe:
                probe.connect(target)
                return socket.AddressFamily(family), str(probe.getsockname()[0])
    return socket.AF_INET, "127.0.0.1"


def _register_peers(rank: int) -> None:
    """Start this rank's beacon and learn every rank's (one collective, at start-up)."""
    global _beacon, _peers
    if _beacon is not None:
        _beacon.close()
    family, address = _reachable_address()
    mine: Peer | None = None
    try:
        _beacon = _Beacon(rank, family, address)
        mine = Peer(rank=rank, host=socket.gethostname(), address=address, port=_beacon.port, pid=os.getpid())
    except OSError as exc:  # no beacon: a lost peer is then reported as the collective's error, as before
        _beacon = None
        log.warning("no liveness beacon on %s (%s): a dead peer will not be named", address, exc)
    gathered: list[Any] = [None] * dist.get_world_size()  # every rank takes part, beacon or not
    dist.all_gather_object(gathered, mine)
    _peers = [p for p in gathered if isinstance(p, Peer)]


def probe(peer: Peer, request: str = "probe", timeout: float = PROBE_TIMEOUT_S) -> str:
    """Send ``request`` to ``peer``'s beacon; its state: "up", "leaving" (it found a peer gone itself),
    "gone" (its process has ended) or "unreachable" (its node or network is down)."""
    try:
        conn = socket.create_connection((peer.address, peer.port), timeout=timeout)
    except (ConnectionRefusedError, ConnectionResetError):
        return "gone"
    except OSError:  # timed out, no route to the host
        return "unreachable"
    with conn:
        try:
            conn.settimeout(ANSWER_TIMEOUT_S)
            conn.sendall(f"{request}\n".encode())
            reply = _read_line(conn).split()
        except ConnectionResetError:
            return "gone"
        except OSError:  # accepted but not answered in time: the process holds its socket, so it lives
            return "up"
    if len(reply) == 3 and reply[:2] == [str(peer.rank), str(peer.pid)]:
        return reply[2]
    # Connected, but not to that rank: its port now belongs to another process.
    return "gone"


def lost_peers(exc: BaseException) -> str | None:
    """One line naming the ranks (and hosts) that died when ``exc`` is a collective failing because of it; None
    when it is not (not a communication error, a single process, or no peer missing).

    The dead are the peers whose beacon is closed or unreachable, less those that said they had found a loss
    themselves (they leave because of it), plus those such peers said were gone; the peers still up are told,
    for when they fail in turn."""
    beacon = _beacon
    if beacon is None or not _peers:
        return None
    if not isinstance(exc, dist.DistError) and not _COMMUNICATION_FAILURE.search(str(exc)):
        return None
    beacon.leaving = True
    try:
        return _name_the_dead(beacon)
    except Exception:  # e.g. no thread to probe with: the collective's own error is still the truth
        beacon.leaving = False
        return None


def _name_the_dead(beacon: _Beacon) -> str | None:
    """Probe every peer, tell those still up which ranks died, and say so in one line (None: nobody died)."""
    others = [p for p in _peers if p.rank != beacon.rank]
    if not others:
        return None
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(64, len(others))) as pool:
        states = dict(zip(others, pool.map(probe, others), strict=True))
        leaving = {p.rank for p, state in states.items() if state == "leaving"} | beacon.told_by
        missing = {p.rank for p, state in states.items() if state in ("gone", "unreachable")}
        known = {p.rank for p in others}
        dead = sorted(((missing - leaving) | beacon.told_gone) & known)
        if not dead:
            beacon.leaving = False  # nobody is missing: not ours to explain
            return None
        notice = f"gone {','.join(map(str, dead))} from {beacon.rank}"
        list(pool.map(lambda p: probe(p, notice), [p for p, state in states.items() if state == "up"]))
    by_rank = {p.rank: p for p in others}
    gone = [by_rank[r] for r in dead if states[by_rank[r]] != "unreachable"]
    unreachable = [by_rank[r] for r in dead if states[by_rank[r]] == "unreachable"]
    parts = []
    if gone:
        parts.append(f"{_listed(gone)} died")
    if unreachable:
        parts.append(f"{_listed(unreachable)} cannot be reached (node or network down)")
    whose = "its own log says why it" if len(dead) == 1 else "their own logs say why they"
    return f"error: {' and '.join(parts)}; rank {beacon.rank} stops too ({whose} ended)"


def _listed(peers: list[Peer]) -> str:
    """One peer as "rank 1 on host a (pid 7)", or several joined with commas and "and"."""
    return str(peers[0]) if len(peers) == 1 else ", ".join(map(str, peers[:-1])) + f" and {peers[-1]}"
