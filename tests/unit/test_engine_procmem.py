"""Writing into another process's memory (the fill's primitive), on a real stopped child process."""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from podsnap.engine import _procmem
from podsnap.engine._procmem import ProcessMemory

SIZE = 3 << 20

CHILD = f"""
import mmap, os, signal, sys, ctypes
m = mmap.mmap(-1, {SIZE}, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
sys.stdout.write(str(ctypes.addressof(ctypes.c_char.from_buffer(m))) + "\\n")
sys.stdout.flush()
os.kill(os.getpid(), signal.SIGSTOP)
"""


@dataclass
class Child:
    proc: subprocess.Popen[str]
    addr: int

    def read(self, addr: int, n: int) -> bytes:
        with Path(f"/proc/{self.proc.pid}/mem").open("rb", buffering=0) as mem:
            mem.seek(addr)
            return mem.read(n)


@pytest.fixture
def child() -> Iterator[Child]:
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    addr = int(proc.stdout.readline())
    try:
        yield Child(proc, addr)
    finally:
        proc.kill()
        proc.wait()


def _source(data: bytes) -> tuple[mmap.mmap, int]:
    buf = mmap.mmap(-1, len(data))
    buf[:] = data
    return buf, ctypes.addressof(ctypes.c_char.from_buffer(buf))


@pytest.mark.parametrize("method", ["auto", "mem"])
def test_bytes_land_at_the_address_in_the_target_by_either_way(child: Child, method: _procmem.Method) -> None:
    data = os.urandom(SIZE - 8192)
    _buf, addr = _source(data)
    target = ProcessMemory(child.proc.pid, method=method)
    try:
        target.write(child.addr + 4096, addr, len(data))
        assert target.method == ("process_vm_writev" if method == "auto" else "/proc/PID/mem")
    finally:
        target.close()
    assert child.read(child.addr + 4096, len(data)) == data
    assert child.read(child.addr, 4096) == bytes(4096), "nothing written outside the range"


def test_where_process_vm_writev_is_refused_the_writes_go_through_proc_mem(
    child: Child, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A seccomp profile that refuses process_vm_writev (EPERM) must not fail the fill."""

    def refused(*_: object) -> int:
        ctypes.set_errno(errno.EPERM)
        return -1

    monkeypatch.setattr(_procmem, "_pvw", refused)
    data = os.urandom(8192)
    _buf, addr = _source(data)
    target = ProcessMemory(child.proc.pid)
    try:
        target.write(child.addr, addr, len(data))
        assert target.method == "/proc/PID/mem"
    finally:
        target.close()
    assert child.read(child.addr, len(data)) == data


def test_an_address_the_target_has_not_mapped_is_an_error_naming_it(child: Child) -> None:
    _buf, addr = _source(b"x" * 4096)
    target = ProcessMemory(child.proc.pid)
    try:
        with pytest.raises(OSError, match=f"pid {child.proc.pid} at 0x1000"):
            target.write(0x1000, addr, 4096)
    finally:
        target.close()


def test_alive_follows_the_process_not_its_pid(child: Child) -> None:
    target = ProcessMemory(child.proc.pid)
    try:
        assert target.alive()
        os.kill(child.proc.pid, signal.SIGKILL)
        child.proc.wait()
        assert not target.alive()
    finally:
        target.close()
