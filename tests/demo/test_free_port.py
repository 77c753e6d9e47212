"""The demo's ports: a worker's port must survive the gap between its dump and its restore unbound."""

from __future__ import annotations

import socket
from pathlib import Path

from podsnap.demo import free_port


def test_ports_lie_below_the_ephemeral_range_and_are_free() -> None:
    """bind(0) hands out ports of the ephemeral range, which connect() also takes."""
    ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(400)]
    assert all(1024 <= p < min(ephemeral, 30000) for p in ports), sorted(ports)
    assert len(set(ports)) == 400, "never the same port twice in one process (etcd, the API server: asked before bound)"
    for port in ports[:5]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
