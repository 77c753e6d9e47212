"""The device operations the weight path needs, and a stand-in device made of the process's own memory.

`Device` is the seam: `CudaDevice` (`_device_cuda`, CUDA driver VMM + pinned host memory, torch
tensors) is the real one; `HostMemoryDevice` is a named stand-in whose "device memory" is anonymous
memory of this process and whose arrays are numpy arrays. The stand-in is faithful where it matters
for the logic: released memory really loses its pages (they come back zeroed, as fresh GPU memory
would), copies are asynchronous per stream (a FIFO worker thread each) and complete in order, events
mark a point in a stream. It serves the CPU tests and the demo's CPU fallback (`--cooperative`), so
the same code path runs under real CRIU without a GPU.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from podsnap.workload import _mem


class Device(Protocol):
    """What `Weights` asks of a device. Addresses are integers; `like` arrays are the framework's tensors."""

    name: str

    def granularity(self) -> int: ...
    def reserve(self, size: int) -> int: ...
    def map(self, addr: int, size: int) -> object: ...
    def unmap(self, addr: int, size: int, handle: object) -> None: ...
    def host_alloc(self, size: int) -> int: ...
    def host_free(self, ptr: int, size: int) -> None: ...
    def host_is_pinned(self, ptr: int) -> bool: ...
    def host_pin(self, ptr: int, size: int) -> None: ...
    def thread_init(self) -> None: ...
    def stream(self) -> object: ...
    def stream_free(self, stream: object) -> None: ...
    def h2d(self, dst: int, src: int, n: int, stream: object) -> None: ...
    def d2h(self, dst: int, src: int, n: int, stream: object) -> None: ...
    def record(self, stream: object) -> object: ...
    def wait(self, event: object) -> None: ...
    def sync(self, stream: object) -> None: ...
    def synchronize(self) -> None: ...
    def accepts(self, array: Any) -> bool: ...
    def describe(self, array: Any) -> tuple[int, int, bool]: ...
    def wrap(self, addr: int, like: Any) -> Any: ...
    def copy_array(self, dst: Any, src: Any) -> None: ...
    def release_cached(self) -> None: ...


#: the stand-in's copy: (dst address, src address, bytes). Tests substitute a slower one.
CopyFn = Callable[[int, int, int], None]


def memmove_copy(dst: int, src: int, n: int) -> None:
    ctypes.memmove(dst, src, n)


class _Stream:
    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="standin-stream")
        self.last: Future[None] | None = None


class HostMemoryDevice:
    """Stand-in device: anonymous memory of this process, numpy arrays, per-stream FIFO copy threads."""

    name = "host"

    def __init__(self, *, granularity: int = 16 * _mem.PAGE, copy: CopyFn = memmove_copy) -> None:
        self._granularity = granularity
        self._copy = copy
        self.pinned: set[int] = set()
        self._lock = threading.Lock()

    def granularity(self) -> int:
        return self._granularity

    def reserve(self, size: int) -> int:
        return _mem.anon_reserve(size)

    def map(self, addr: int, size: int) -> object:
        _mem.anon_commit(addr, size)
        return (addr, size)

    def unmap(self, addr: int, size: int, handle: object) -> None:
        _mem.anon_decommit(addr, size)

    def host_alloc(self, size: int) -> int:
        ptr = _mem.anon_alloc(size)
        with self._lock:
            self.pinned.add(ptr)
        return ptr

    def host_free(self, ptr: int, size: int) -> None:
        with self._lock:
            self.pinned.discard(ptr)
        _mem.anon_free(ptr, size)

    def host_is_pinned(self, ptr: int) -> bool:
        with self._lock:
            return ptr in self.pinned

    def host_pin(self, ptr: int, size: int) -> None:
        with self._lock:
            self.pinned.add(ptr)

    def thread_init(self) -> None:
        pass

    def stream(self) -> object:
        return _Stream()

    def stream_free(self, stream: object) -> None:
        assert isinstance(stream, _Stream)
        stream.pool.shutdown(wait=True)

    def _submit(self, stream: object, fn: Callable[[], None]) -> Future[None]:
        assert isinstance(stream, _Stream)
        fut = stream.pool.submit(fn)
        stream.last = fut
        return fut

    def h2d(self, dst: int, src: int, n: int, stream: object) -> None:
        self._submit(stream, lambda: self._copy(dst, src, n))

    def d2h(self, dst: int, src: int, n: int, stream: object) -> None:
        self._submit(stream, lambda: self._copy(dst, src, n))

    def record(self, stream: object) -> object:
        return self._submit(stream, lambda: None)

    def wait(self, event: object) -> None:
        assert isinstance(event, Future)
        event.result()

    def sync(self, stream: object) -> None:
        self.wait(self.record(stream))

    def synchronize(self) -> None:
        pass

    def accepts(self, array: Any) -> bool:
        return type(array).__module__.split(".")[0] == "numpy"

    def describe(self, array: Any) -> tuple[int, int, bool]:
        """(bytes, address, contiguous)"""
        return int(array.nbytes), int(array.ctypes.data), bool(array.flags["C_CONTIGUOUS"])

    def wrap(self, addr: int, like: Any) -> Any:
        import numpy as np

        buf = _mem.view(addr, int(like.nbytes))
        return np.frombuffer(buf, dtype=like.dtype, count=like.size).reshape(like.shape)

    def copy_array(self, dst: Any, src: Any) -> None:
        dst[...] = src

    def release_cached(self) -> None:
        pass


def slow_copy(delay_s: float) -> CopyFn:
    """A stand-in copy that takes `delay_s` before moving the bytes (exposes buffer reuse races in tests)."""

    def copy(dst: int, src: int, n: int) -> None:
        time.sleep(delay_s)
        ctypes.memmove(dst, src, n)

    return copy
