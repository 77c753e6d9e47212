"""The demo's ports: a worker's port must survive the gap between its dump and its restore unbound."""

from __future__ import annotations

import socket
from pathlib import Path

from podsnap.demo import free_port


def test_ports_lie_below_the_ephemeral_range_and_are_free() -> None:
    """bind(0) hands out ports of the ephemeral range, which connect() also takes."""
    ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_port() for _ in range(50)}
    assert all(1024 <= p < min(ephemeral, 30000) for p in ports), sorted(ports)
    assert len(ports) > 1, "random, so two runs at once rarely collide"
    for port in list(ports)[:5]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
