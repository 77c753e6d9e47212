"""Anonymous memory by address (mmap/mprotect/munmap through libc): what the weight path's buffers are made of."""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
from concurrent.futures import ThreadPoolExecutor

PROT_NONE = 0x0
PROT_RW = 0x1 | 0x2
MAP_PRIVATE = 0x02
MAP_FIXED = 0x10
MAP_ANONYMOUS = 0x20
MAP_NORESERVE = 0x4000
MADV_HUGEPAGE = 14
PAGE = mmap.PAGESIZE


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    libc.memcmp.restype = ctypes.c_int
    return libc


def _map(addr: int, size: int, prot: int, flags: int) -> int:
    ptr = _libc().mmap(addr or None, size, prot, flags, -1, 0)
    if ptr is None or ptr == ctypes.c_void_p(-1).value:
        err = ctypes.get_errno()
        raise OSError(err, f"mmap of {size} bytes: {os.strerror(err)}")
    return int(ptr)


def anon_alloc(size: int, *, huge: bool = True, prefault_threads: int = 0) -> int:
    """Fresh zeroed read-write memory; huge pages asked for (faster to fault in, to pin and to copy).

    `prefault_threads` > 0 touches every page first, from that many threads: pinning fresh memory
    faults it in on one thread (8 GiB: 2.6 s on the H200), touching it in parallel first is faster.
    """
    ptr = _map(0, size, PROT_RW, MAP_PRIVATE | MAP_ANONYMOUS)
    if huge:
        _libc().madvise(ptr, size, MADV_HUGEPAGE)  # advisory: THP may be off
    if prefault_threads > 0:
        step = _round_up(-(-size // prefault_threads), 2 << 20)
        spans = [(ptr + off, min(step, size - off)) for off in range(0, size, step)]
        with ThreadPoolExecutor(max_workers=len(spans)) as pool:  # ctypes.memset runs without the GIL
            list(pool.map(lambda span: ctypes.memset(span[0], 0, span[1]), spans))
    return ptr


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def anon_reserve(size: int) -> int:
    """Address space only (PROT_NONE, no pages, no commit charge)."""
    return _map(0, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE)


def anon_commit(addr: int, size: int) -> None:
    """Fresh zeroed read-write pages at exactly [addr, addr+size) (inside a reservation)."""
    _map(addr, size, PROT_RW, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED)


def anon_decommit(addr: int, size: int) -> None:
    """Drop the pages at [addr, addr+size) and make it inaccessible again; the addresses stay reserved."""
    _map(addr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE)


def anon_free(addr: int, size: int) -> None:
    if _libc().munmap(addr, size) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"munmap: {os.strerror(err)}")


def view(addr: int, size: int) -> memoryview:
    """A writable byte view of raw memory (the caller keeps the memory alive)."""
    return memoryview((ctypes.c_uint8 * size).from_address(addr)).cast("B")


def equal(a: int, b: int, size: int) -> bool:
    """memcmp of two raw ranges."""
    return int(_libc().memcmp(a, b, size)) == 0


def address_of(buf: bytearray) -> int:
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))
