"""`Weights`: a worker's immutable GPU tensors leave the checkpoint and stream back after the restore.

    from podsnap.workload import FileSource, SnapshotControl, Weights

    weights = Weights()                                   # device picked from the first tensor adopted
    model.load_state_dict(...)                            # load as usual, then, BEFORE compile/graph capture:
    weights.adopt_module(model, sources={"lm_head.weight": FileSource("/models/m.bin", offset=4096)})
    w = weights.adopt("embedding", w, source=None)        # or one tensor; use the tensor it returns
    model = torch.compile(model, mode="reduce-overhead")  # CUDA graphs capture the adopted addresses
    warm_up(model)

    snap = SnapshotControl()
    snap.on_quiesce(stop_generation)
    weights.attach(snap)            # quiesce: offload (last); resume: reload (before the hooks after it)
    snap.on_resume(reconnect)
    snap.checkpoint_and_wait()

Adopt: each tensor is copied into memory the SDK owns, a CUDA VMM range on the GPU (cuMemAddressReserve
once, physical memory mapped into it), and the tensor returned aliases it; `adopt_module` swaps every
parameter's storage in place. A weight with a `FileSource` must be the file's exact bytes at that offset
(same dtype and layout); they are compared once at adopt time (`verify_source=False` skips that), and
the file's size and mtime are recorded.

Offload (quiesce, after generation stopped): weights without a usable file source are copied to host
memory of the process (pinned, several streams) - that host copy is what the checkpoint carries;
weights from a file are not copied at all. Then the physical GPU memory is unmapped and released; the
addresses stay reserved, so the CUDA checkpoint and the CRIU image shrink to the rest of the process.

Reload (resume, before the worker serves): the same addresses get new physical memory; the host copy
streams back with pinned host->device copies (several streams); file weights are read by `threads`
threads, each through two pinned staging buffers of `staging_bytes` and its own stream. The staging
buffers are allocated before the checkpoint and kept (pinned memory survives checkpoint and restore,
measured), checked after the restore and re-pinned if the driver no longer knows them. CUDA graphs
captured on adopted tensors replay unchanged: the addresses never moved.

What is verified where: see docs/weights.md. Errors: WeightsError, WeightSourceError (names the tensor
and the file). torch and cuda-bindings are imported only when a CUDA tensor is adopted; numpy arrays
use the stand-in `HostMemoryDevice` (the demo's CPU path and the CPU tests).
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podsnap.workload import _mem
from podsnap.workload._devices import Device, HostMemoryDevice
from podsnap.workload._errors import WeightsError, WeightSourceError

if TYPE_CHECKING:
    from podsnap.workload._snapshot import ResumeInfo, SnapshotControl

MIB = 1 << 20
GIB = 1 << 30
#: reader threads for file sources when none are given: page cache -> pinned -> GPU ran at 22.6 GiB/s with
#: 8 threads and 27.9 with 16 on the H200 (DESIGN.md); more than the cores only adds switching
DEFAULT_MAX_THREADS = 16


def default_threads() -> int:
    return max(1, min(DEFAULT_MAX_THREADS, os.cpu_count() or 1))


#: every adopted tensor starts on this boundary (what CUDA's allocators give, and vector loads expect)
ALIGN = 512


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


@dataclass(frozen=True)
class FileSource:
    """The weight is the `nbytes` bytes at `offset` of `path`, a file the restore node has at the same path."""

    path: Path | str
    offset: int = 0

    def __post_init__(self) -> None:
        if self.offset < 0:
            raise ValueError(f"FileSource({self.path!s}): offset must be >= 0, got {self.offset}")


@dataclass(frozen=True)
class FileIdentity:
    """What is compared after the restore: size and modification time (not the content: docs/weights.md)."""

    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path | str) -> FileIdentity:
        st = Path(path).stat()
        return cls(size=st.st_size, mtime_ns=st.st_mtime_ns)


@dataclass
class _Slot:
    name: str
    addr: int
    nbytes: int
    source: FileSource | None
    identity: FileIdentity | None
    #: during an offload: held in the host copy at this offset (None: comes back from its file)
    host_offset: int | None = None


@dataclass
class _Extent:
    addr: int
    size: int
    handle: object | None  # None while released


@dataclass
class _Segment:
    base: int
    size: int
    used: int = 0
    mapped: int = 0
    extents: list[_Extent] = field(default_factory=list)


def _device_for(array: Any) -> Device:
    module = type(array).__module__.split(".")[0]
    if module == "torch":
        from podsnap.workload._device_cuda import CudaDevice

        return CudaDevice(array.device.index)
    if module == "numpy":
        return HostMemoryDevice()
    raise WeightsError(f"cannot adopt a {type(array).__module__}.{type(array).__name__}: a torch CUDA tensor is needed")


class Weights:
    """The cooperative weight path (module docstring). One per worker; not thread-safe against itself."""

    def __init__(
        self,
        *,
        device: Device | None = None,
        threads: int | None = None,
        staging_bytes: int = 8 * MIB,
        streams: int = 4,
        copy_chunk_bytes: int = 64 * MIB,
        segment_bytes: int = 16 * GIB,
        map_step_bytes: int = 32 * MIB,
    ) -> None:
        threads = default_threads() if threads is None else threads
        if threads < 1 or streams < 1:
            raise ValueError(f"threads and streams must be >= 1, got {threads} and {streams}")
        if staging_bytes < _mem.PAGE or copy_chunk_bytes < _mem.PAGE:
            raise ValueError("staging_bytes and copy_chunk_bytes must be at least a page")
        self.device = device
        self.threads = threads
        self.staging_bytes = _round_up(staging_bytes, _mem.PAGE)
        self.streams = streams
        self.copy_chunk_bytes = copy_chunk_bytes
        self.segment_bytes = segment_bytes
        self.map_step_bytes = map_step_bytes
        self._slots: dict[str, _Slot] = {}
        self._segments: list[_Segment] = []
        self._staging = 0
        self._host = 0
        self._host_size = 0
        self._resident = True
        self._freeing: threading.Thread | None = None
        self.last_offload: dict[str, Any] = {}
        self.last_reload: dict[str, Any] = {}

    # -- state ----------------------------------------------------------------------------------
    @property
    def resident(self) -> bool:
        """True while the weights are on the device (False between offload and reload)."""
        return self._resident

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self._slots.values())

    @property
    def names(self) -> list[str]:
        return list(self._slots)

    def _dev(self) -> Device:
        if self.device is None:
            raise WeightsError("no weight adopted yet: nothing to offload or reload")
        return self.device

    # -- adopt ----------------------------------------------------------------------------------
    def adopt(self, name: str, tensor: Any, *, source: FileSource | None = None, verify_source: bool = True) -> Any:
        """Copy `tensor` into SDK-owned device memory; return the tensor that aliases it (use that one)."""
        self._adoptable(name)
        if self.device is None:
            self.device = _device_for(tensor)
        dev = self.device
        if not dev.accepts(tensor):
            raise WeightsError(f"weight {name!r}: a {type(tensor).__name__} is not an array of the {dev.name} device")
        nbytes, _, contiguous = dev.describe(tensor)
        if not contiguous:
            raise WeightsError(f"weight {name!r} is not contiguous; adopt tensor.contiguous() instead")
        if nbytes == 0:
            raise WeightsError(f"weight {name!r} is empty; adopt only tensors that hold data")
        identity = self._source_identity(name, source, nbytes) if source is not None else None
        addr = self._alloc(nbytes)
        new = dev.wrap(addr, tensor)
        dev.copy_array(new, tensor)
        slot = _Slot(name, addr, nbytes, source, identity)
        if source is not None and verify_source:
            dev.synchronize()
            self._verify_source(slot)
        self._slots[name] = slot
        return new

    def adopt_module(
        self,
        module: Any,
        *,
        sources: Mapping[str, FileSource] | None = None,
        verify_sources: bool = True,
    ) -> int:
        """Adopt every parameter of a torch module, in place (`param.data` swapped); returns the bytes adopted.

        Parameters shared between names are adopted once. `sources` maps parameter names (as
        `named_parameters()` gives them) to files; an unknown name there is an error.
        """
        params: list[tuple[str, Any]] = []
        seen: set[int] = set()
        for pname, p in module.named_parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            params.append((pname, p))
        unknown = sorted(set(sources or {}) - {n for n, _ in params})
        if unknown:
            raise WeightsError(f"sources name no parameter of the module: {', '.join(unknown)}")
        total = 0
        for _, p in params:
            if self.device is None:
                self.device = _device_for(p.data)
            total += _round_up(self.device.describe(p.data)[0], ALIGN)
        self._prepare(total)
        for pname, p in params:
            p.data = self.adopt(pname, p.data, source=(sources or {}).get(pname), verify_source=verify_sources)
        if self.device is not None:
            self.device.release_cached()  # the originals' memory goes back to the device
        return total

    def _adoptable(self, name: str) -> None:
        if not self._resident:
            raise WeightsError(f"cannot adopt {name!r} while the weights are offloaded; reload() first")
        if name in self._slots:
            raise WeightsError(f"weight {name!r} is adopted already; names must be unique")

    def _source_identity(self, name: str, source: FileSource, nbytes: int) -> FileIdentity:
        try:
            identity = FileIdentity.of(source.path)
        except OSError as e:
            raise WeightSourceError(f"weight {name!r}: its source {source.path} cannot be read: {e.strerror}") from e
        if source.offset + nbytes > identity.size:
            raise WeightSourceError(
                f"weight {name!r} ({nbytes} bytes at offset {source.offset}) does not fit in {source.path} "
                f"({identity.size} bytes)"
            )
        return identity

    # -- the address space ----------------------------------------------------------------------
    def _prepare(self, nbytes: int) -> None:
        """Make room for `nbytes` more in one go (one reservation, one mapping) when adopting many tensors."""
        dev = self._dev()
        seg = self._segments[-1] if self._segments else None
        if seg is None or _round_up(seg.used, ALIGN) + nbytes > seg.size:
            seg = self._new_segment(nbytes)
        self._map_through(seg, _round_up(seg.used, ALIGN) + nbytes, step=dev.granularity())

    def _new_segment(self, nbytes: int) -> _Segment:
        dev = self._dev()
        size = _round_up(max(self.segment_bytes, nbytes), dev.granularity())
        seg = _Segment(base=dev.reserve(size), size=size)
        self._segments.append(seg)
        return seg

    def _map_through(self, seg: _Segment, end: int, *, step: int) -> None:
        if end <= seg.mapped:
            return
        dev = self._dev()
        size = min(_round_up(max(end - seg.mapped, step), dev.granularity()), seg.size - seg.mapped)
        addr = seg.base + seg.mapped
        seg.extents.append(_Extent(addr, size, dev.map(addr, size)))
        seg.mapped += size

    def _alloc(self, nbytes: int) -> int:
        seg = self._segments[-1] if self._segments else None
        if seg is None or _round_up(seg.used, ALIGN) + nbytes > seg.size:
            seg = self._new_segment(nbytes)
        start = _round_up(seg.used, ALIGN)
        self._map_through(seg, start + nbytes, step=self.map_step_bytes)
        seg.used = start + nbytes
        return seg.base + start

    def _extents(self) -> list[_Extent]:
        return [e for seg in self._segments for e in seg.extents]

    # -- offload --------------------------------------------------------------------------------
    def attach(self, snap: SnapshotControl) -> None:
        """Offload as a quiesce hook and reload as a resume hook of `snap`, in its registration order.

        Attach after the hooks that stop generation (the weights must be idle when they go) and before
        resume hooks that use the model.
        """

        def offload() -> None:
            self.offload()

        def reload(info: ResumeInfo) -> None:
            self.reload()

        snap.on_quiesce(offload, name="podsnap.weights.offload")
        snap.on_resume(reload, name="podsnap.weights.reload")

    def offload(self) -> dict[str, Any]:
        """Save what has no file, release the device memory (keeping the addresses). Idempotent."""
        if not self._resident or not self._slots:
            return self.last_offload
        dev = self._dev()
        self._join_freeing()
        t0 = time.monotonic()
        dev.thread_init()
        dev.synchronize()
        changed: list[str] = []
        saved: list[_Slot] = []
        for slot in self._slots.values():
            slot.host_offset = None
            if slot.source is None:
                saved.append(slot)
                continue
            try:
                same = FileIdentity.of(slot.source.path) == slot.identity
            except OSError:
                same = False
            if not same:
                # the file changed since it was adopted: it no longer holds this weight, so keep a copy
                changed.append(slot.name)
                saved.append(slot)
        host_size = 0
        for slot in saved:
            slot.host_offset = host_size
            host_size += _round_up(slot.nbytes, _mem.PAGE)
        t_alloc = time.monotonic()
        if host_size:
            self._host = dev.host_alloc(host_size)
            self._host_size = host_size
        alloc_s = time.monotonic() - t_alloc
        try:
            t_copy = time.monotonic()
            self._copy_saved(saved, to_host=True)
            copy_s = time.monotonic() - t_copy
            if any(s.host_offset is None for s in self._slots.values()):
                self._ensure_staging()  # before the checkpoint: the restore finds it ready
        except BaseException:
            self._free_host()
            raise
        t_unmap = time.monotonic()
        for extent in self._extents():
            if extent.handle is not None:
                dev.unmap(extent.addr, extent.size, extent.handle)
                extent.handle = None
        self._resident = False
        saved_bytes = sum(s.nbytes for s in saved)
        self.last_offload = {
            "bytes": self.nbytes,
            "saved_bytes": saved_bytes,
            "file_bytes": self.nbytes - saved_bytes,
            "changed_sources": changed,
            "host_alloc_s": alloc_s,
            "d2h_s": copy_s,
            "d2h_GBps": saved_bytes / copy_s / 1e9 if copy_s > 0 and saved_bytes else None,
            "release_s": time.monotonic() - t_unmap,
            "total_s": time.monotonic() - t0,
        }
        return self.last_offload

    # -- reload ---------------------------------------------------------------------------------
    def reload(self) -> dict[str, Any]:
        """Map the same addresses again and stream every weight back. Idempotent; raises before mapping
        anything when a file source is missing or changed."""
        if self._resident:
            return self.last_reload
        dev = self._dev()
        t0 = time.monotonic()
        dev.thread_init()  # the restored main thread may not have the context current
        from_file = [s for s in self._slots.values() if s.host_offset is None]
        for slot in from_file:
            self._check_identity(slot)
        t_map = time.monotonic()
        for extent in self._extents():
            if extent.handle is None:
                extent.handle = dev.map(extent.addr, extent.size)
        map_s = time.monotonic() - t_map
        repinned: list[str] = []
        if self._host and not dev.host_is_pinned(self._host):
            dev.host_pin(self._host, self._host_size)
            repinned.append("host copy")
        if from_file:
            repinned += self._ensure_staging()
        saved = [s for s in self._slots.values() if s.host_offset is not None]
        t_copy = time.monotonic()
        streams = [dev.stream() for _ in range(self.streams)] if saved else []
        try:
            self._issue_saved(saved, streams, to_host=False)
            file_s = self._stream_files(from_file)
            for s in streams:
                dev.sync(s)
        finally:
            for s in streams:
                dev.stream_free(s)
        copy_s = time.monotonic() - t_copy
        self._resident = True
        self._free_host_later()
        file_bytes = sum(s.nbytes for s in from_file)
        self.last_reload = {
            "bytes": self.nbytes,
            "saved_bytes": self.nbytes - file_bytes,
            "file_bytes": file_bytes,
            "map_s": map_s,
            "copy_s": copy_s,
            "file_s": file_s,
            "GiBps": self.nbytes / GIB / copy_s if copy_s > 0 else None,
            "repinned": repinned,
            "threads": self.threads if from_file else 0,
            "total_s": time.monotonic() - t0,
        }
        return self.last_reload

    def _check_identity(self, slot: _Slot) -> None:
        assert slot.source is not None and slot.identity is not None
        path = slot.source.path
        try:
            now = FileIdentity.of(path)
        except OSError as e:
            raise WeightSourceError(
                f"weight {slot.name!r}: its source {path} is gone on this node ({e.strerror}); the weights cannot be "
                "reloaded, so this worker cannot serve"
            ) from e
        if now != slot.identity:
            raise WeightSourceError(
                f"weight {slot.name!r}: its source {path} changed since the capture (size {slot.identity.size} -> "
                f"{now.size}, mtime_ns {slot.identity.mtime_ns} -> {now.mtime_ns}); refusing to load other bytes"
            )

    # -- copies ---------------------------------------------------------------------------------
    def _chunks(self, slots: list[_Slot], size: int) -> list[tuple[_Slot, int, int]]:
        """(slot, offset in the slot, bytes) pieces of at most `size`."""
        return [(s, off, min(size, s.nbytes - off)) for s in slots for off in range(0, s.nbytes, size)]

    def _issue_saved(self, slots: list[_Slot], streams: list[object], *, to_host: bool) -> None:
        dev = self._dev()
        for i, (slot, off, n) in enumerate(self._chunks(slots, self.copy_chunk_bytes)):
            assert slot.host_offset is not None
            host = self._host + slot.host_offset + off
            if to_host:
                dev.d2h(host, slot.addr + off, n, streams[i % len(streams)])
            else:
                dev.h2d(slot.addr + off, host, n, streams[i % len(streams)])

    def _copy_saved(self, slots: list[_Slot], *, to_host: bool) -> None:
        if not slots:
            return
        dev = self._dev()
        streams = [dev.stream() for _ in range(self.streams)]
        try:
            self._issue_saved(slots, streams, to_host=to_host)
            for s in streams:
                dev.sync(s)
        finally:
            for s in streams:
                dev.stream_free(s)

    def _ensure_staging(self) -> list[str]:
        """Two pinned buffers per thread, allocated once and kept; re-pinned if the driver forgot them."""
        dev = self._dev()
        size = 2 * self.threads * self.staging_bytes
        if not self._staging:
            self._staging = dev.host_alloc(size)
            return []
        if dev.host_is_pinned(self._staging):
            return []
        try:
            dev.host_pin(self._staging, size)
        except WeightsError:
            # the old range is unusable: take a fresh one (slower: page faults and pinning now)
            self._staging = dev.host_alloc(size)
        return ["staging"]

    def _parallel(
        self, jobs: list[tuple[_Slot, int, int]], work: Callable[[int, int, object, tuple[_Slot, int, int]], None]
    ) -> None:
        """Run `work(thread index, staging buffer, stream, job)` over the jobs on `threads` threads.

        Each thread alternates between its two staging buffers and waits for the copy that last used a
        buffer before refilling it (an event per buffer), so a read overlaps the previous copy.
        """
        dev = self._dev()
        q: queue.SimpleQueue[tuple[_Slot, int, int]] = queue.SimpleQueue()
        for job in jobs:
            q.put(job)
        stop = threading.Event()
        errors: list[BaseException] = []

        def run(i: int) -> None:
            stream: object | None = None
            events: list[object | None] = [None, None]
            try:
                dev.thread_init()
                stream = dev.stream()
                k = 0
                while not stop.is_set():
                    try:
                        job = q.get_nowait()
                    except queue.Empty:
                        break
                    b = k % 2
                    pending = events[b]
                    if pending is not None:
                        events[b] = None
                        dev.wait(pending)
                    buf = self._staging + (2 * i + b) * self.staging_bytes
                    work(i, buf, stream, job)
                    events[b] = dev.record(stream)
                    k += 1
            except BaseException as e:
                errors.append(e)
                stop.set()
            finally:
                for ev in events:
                    if ev is not None:
                        with contextlib.suppress(Exception):
                            dev.wait(ev)
                if stream is not None:
                    with contextlib.suppress(Exception):
                        dev.sync(stream)
                        dev.stream_free(stream)

        workers = [threading.Thread(target=run, args=(i,), name=f"podsnap-weights-{i}") for i in range(self.threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        if errors:
            raise errors[0]

    def _stream_files(self, slots: list[_Slot]) -> float:
        """Read every file weight into place through the staging buffers; seconds."""
        if not slots:
            return 0.0
        t0 = time.monotonic()
        dev = self._dev()
        fds: dict[str, int] = {}
        lock = threading.Lock()

        def fd_of(path: Path | str) -> int:
            key = os.fspath(path)
            with lock:
                if key not in fds:
                    fds[key] = os.open(key, os.O_RDONLY | os.O_CLOEXEC)
                return fds[key]

        def work(_: int, buf: int, stream: object, job: tuple[_Slot, int, int]) -> None:
            slot, off, n = job
            assert slot.source is not None
            _read_exact(fd_of(slot.source.path), _mem.view(buf, n), slot.source.offset + off, slot)
            dev.h2d(slot.addr + off, buf, n, stream)

        try:
            self._parallel(self._chunks(slots, self.staging_bytes), work)
        finally:
            for fd in fds.values():
                os.close(fd)
        return time.monotonic() - t0

    def _verify_source(self, slot: _Slot) -> None:
        """Compare the adopted device bytes with the file's, chunk by chunk (device -> staging, file -> memory)."""
        assert slot.source is not None
        self._ensure_staging()
        dev = self._dev()
        source = slot.source
        mismatch: list[int] = []

        file_bufs = [bytearray(self.staging_bytes) for _ in range(self.threads)]
        fd = os.open(source.path, os.O_RDONLY | os.O_CLOEXEC)

        def work(i: int, buf: int, stream: object, job: tuple[_Slot, int, int]) -> None:
            off, n = job[1], job[2]
            dev.d2h(buf, slot.addr + off, n, stream)
            _read_exact(fd, memoryview(file_bufs[i])[:n], source.offset + off, slot)
            dev.sync(stream)
            if not _mem.equal(buf, _mem.address_of(file_bufs[i]), n):
                mismatch.append(off)

        try:
            self._parallel(self._chunks([slot], self.staging_bytes), work)
        finally:
            os.close(fd)
        if mismatch:
            off = min(mismatch)
            raise WeightSourceError(
                f"weight {slot.name!r} differs from {source.path} (first different chunk at byte {off} of the weight, "
                f"file offset {source.offset + off}): a file source must hold exactly the tensor's bytes (same dtype "
                "and layout); adopt it without a source to keep a copy instead"
            )

    # -- host memory ----------------------------------------------------------------------------
    def _free_host(self) -> None:
        if self._host:
            self._dev().host_free(self._host, self._host_size)
            self._host, self._host_size = 0, 0

    def _free_host_later(self) -> None:
        """The host copy is no longer needed once the weights are back; free it off the serving path."""
        if not self._host:
            return
        dev, host, size = self._dev(), self._host, self._host_size
        self._host, self._host_size = 0, 0

        def free() -> None:
            dev.thread_init()
            dev.host_free(host, size)

        self._freeing = threading.Thread(target=free, name="podsnap-weights-free", daemon=True)
        self._freeing.start()

    def _join_freeing(self) -> None:
        if self._freeing is not None:
            self._freeing.join()
            self._freeing = None

    def close(self) -> None:
        """Free the host buffers (the device memory stays while the adopted tensors are in use)."""
        self._join_freeing()
        self._free_host()
        if self._staging and self.device is not None:
            self.device.host_free(self._staging, 2 * self.threads * self.staging_bytes)
            self._staging = 0


def _read_exact(fd: int, view: memoryview, offset: int, slot: _Slot) -> None:
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)
        if got <= 0:
            assert slot.source is not None
            raise WeightSourceError(
                f"weight {slot.name!r}: {slot.source.path} ended at offset {offset + done}, "
                f"{len(view) - done} bytes short"
            )
        done += got
