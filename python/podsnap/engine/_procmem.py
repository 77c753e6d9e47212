"""Writing bytes into another process's memory, for the fill of a stopped restored tree.

`process_vm_writev` copies straight from our buffer into the target's pages and pins them a thousand at a
time; a write to `/proc/PID/mem` copies each 4 KiB page twice (through a kernel bounce page) and looks
it up alone. Measured on a 2-core VM (bench/NOTES.md, 2026-12-01): the same CPU cost for 4 KiB pages,
but on transparent huge pages `/proc/PID/mem` costs about twice as much CPU and process_vm_writev less
than on 4 KiB pages. Both need the same right (ptrace attach: root or the target's owner with
CAP_SYS_PTRACE where Yama asks for it); where a seccomp profile refuses process_vm_writev (EPERM,
ENOSYS), the writes go through `/proc/PID/mem`.

process_vm_writev names its target by PID, so every write could reach another process if the target
died and its PID were reused; a pidfd taken before the first write tells the caller whether the
target is still the one it started with (`alive()`), which `fill` checks after every chunk.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
import select
import threading
from typing import Literal

Method = Literal["auto", "mem"]


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


_LIBC = _libc()
_pvw = _LIBC.process_vm_writev
_pvw.argtypes = [
    ctypes.c_int,
    ctypes.POINTER(_IoVec),
    ctypes.c_ulong,
    ctypes.POINTER(_IoVec),
    ctypes.c_ulong,
    ctypes.c_ulong,
]
_pvw.restype = ctypes.c_ssize_t
_LIBC.mmap.restype = ctypes.c_void_p
_LIBC.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_LIBC.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


def map_readonly(fd: int, size: int) -> int:
    """Address of a read-only shared mapping of the first `size` bytes of file `fd` (a local source for
    `ProcessMemory.write`; Python's mmap objects do not give their address for read-only mappings)."""
    base = _LIBC.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if base is None or base == _MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, f"mmap of {size} bytes: {os.strerror(err)}")
    return int(base)


def unmap(addr: int, size: int) -> None:
    _LIBC.munmap(addr, size)


class ProcessMemory:
    """Write access to the memory of process `pid` (a host PID). Thread-safe; `close()` when done.

    `method="mem"` always writes through /proc/PID/mem (the fallback, chosen explicitly in tests)."""

    def __init__(self, pid: int, *, method: Method = "auto") -> None:
        self.pid = pid
        self._pidfd = os.pidfd_open(pid)
        self._mem: int | None = None
        self._lock = threading.Lock()
        self.method: str = "process_vm_writev"
        if method == "mem":
            self._use_mem()

    def _use_mem(self) -> int:
        with self._lock:
            if self._mem is None:
                self._mem = os.open(f"/proc/{self.pid}/mem", os.O_RDWR | os.O_CLOEXEC)
                self.method = "/proc/PID/mem"
            return self._mem

    def write(self, vaddr: int, addr: int, length: int) -> None:
        """Copy `length` bytes at address `addr` of this process to `vaddr` of the target."""
        while length > 0:
            mem = self._mem
            if mem is not None:
                n = os.pwrite(mem, memoryview((ctypes.c_char * length).from_address(addr)).cast("B"), vaddr)
            else:
                local, remote = _IoVec(addr, length), _IoVec(vaddr, length)
                n = _pvw(self.pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
                if n < 0:
                    err = ctypes.get_errno()
                    if err in (errno.ENOSYS, errno.EPERM):
                        self._use_mem()  # refused here (seccomp, an old kernel): the other way
                        continue
                    raise OSError(err, f"process_vm_writev into pid {self.pid} at {vaddr:#x}: {os.strerror(err)}")
            if n <= 0:
                raise OSError(f"writing the memory of pid {self.pid} at {vaddr:#x} wrote nothing")
            vaddr, addr, length = vaddr + n, addr + n, length - n

    def alive(self) -> bool:
        """True while the process this object was made for has not exited (its PID is still its own)."""
        poller = select.poll()
        poller.register(self._pidfd, select.POLLIN)
        return not poller.poll(0)

    def close(self) -> None:
        os.close(self._pidfd)
        if self._mem is not None:
            os.close(self._mem)
