"""The rendezvous port: free, and outside the ports that outgoing connections take (``training/ports.py``)."""

from __future__ import annotations

import socket

import pytest

from megatron_ext.training import ports

pytestmark = pytest.mark.unit


def test_the_port_is_free_and_below_the_ephemeral_range() -> None:
    low = int(ports.EPHEMERAL_RANGE.read_text().split()[0])
    picked = {ports.free_port() for _ in range(20)}
    assert all(ports.LOWEST <= p < low for p in picked) and len(picked) > 1  # drawn at random
    with socket.socket() as s:
        s.bind(("127.0.0.1", picked.pop()))


def test_without_a_known_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", ports.Path("/nonexistent/ip_local_port_range"))
    assert 0 < ports.free_port() < 65536
