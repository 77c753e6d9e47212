"""Find the outgoing TCP connections of this process tree that cannot follow it to another pod.

An established connection to a non-loopback address is tied to the capture pod's IP: after a
restore in another pod it is dead (CRIU closes or cannot restore it). Connections accepted on one
of our own listening ports are clients of ours, and loopback ones stay inside the pod; neither
counts. Linux only: read from /proc.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

_ESTABLISHED = "01"
_LISTEN = "0A"


def _tree(root: int, proc: Path) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _socket_inodes(pids: set[int], proc: Path) -> set[str]:
    inodes = set()
    for pid in pids:
        try:
            fds = list((proc / str(pid) / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = str(fd.readlink())
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def _address(hex_addr: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    host, port = hex_addr.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw[::-1]), int(port, 16)
    # IPv6 in /proc is four 32-bit words, each in host (little-endian) order
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    addr = ipaddress.IPv6Address(words)
    return (addr.ipv4_mapped or addr), int(port, 16)


def outside_connections(pid: int | None = None, proc: Path = Path("/proc")) -> list[str]:
    """ "HOST:PORT" of every established outgoing TCP connection of `pid`'s tree to a non-loopback peer."""
    pids = _tree(os.getpid() if pid is None else pid, proc)
    inodes = _socket_inodes(pids, proc)
    rows: list[list[str]] = []
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / str(os.getpid() if pid is None else pid) / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        rows.extend(line.split() for line in lines)
    ours = [r for r in rows if len(r) > 9 and r[9] in inodes]
    listening = {_address(r[1])[1] for r in ours if r[3] == _LISTEN}
    found = []
    for r in ours:
        if r[3] != _ESTABLISHED:
            continue
        local_port = _address(r[1])[1]
        remote, remote_port = _address(r[2])
        if remote.is_loopback or local_port in listening:
            continue
        found.append(f"{remote}:{remote_port}" if remote.version == 4 else f"[{remote}]:{remote_port}")
    return sorted(set(found))
