"""A free TCP port for a rendezvous on this machine (the runtime's, which the launcher borrows)."""

from __future__ import annotations

import contextlib
import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
"""Linux: the ports the kernel hands to outgoing connections and to ``bind(port 0)``."""

LOWEST = 10_000
"""The lowest port picked (below, the ports of well-known services)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, chosen at random below the ephemeral range
    where there is one: a port from that range (what ``bind(port 0)`` gives) can be taken, before the rendezvous
    binds it, as the local end of any outgoing connection, such as another job's gloo connections on the same
    machine."""
    low = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        low = int(EPHEMERAL_RANGE.read_text().split()[0])
    pick = random.SystemRandom()
    for _ in range(100 if low > LOWEST + 1000 else 0):
        port = pick.randrange(LOWEST, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
