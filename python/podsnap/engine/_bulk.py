"""The fast restore's two halves: bulk memory cut out of CRIU's images at capture, written back in parallel.

CRIU restores pages with one thread (≈1.8 GiB/s on the H200), and a CUDA worker's image is mostly one
thing: the host copy of its GPU memory, a few huge runs of private anonymous pages. So:

cut (capture, after the dump): for each process, the runs of present pages of at least `min_run` bytes
inside plain private anonymous read-write VMAs leave CRIU's image. The original `pages-N.img` is renamed
to `bulk/pages-N.raw` (no copy of the bulk), and a new small `pages-N.img` + `pagemap-N.img` keep only
the rest (a copy of the small remainder; its bytes are then punched out of the raw file where the
filesystem can). Each run becomes an extent (pid, vaddr, length, file, offset). Nothing else changes:
the VMAs stay in `mm-N.img`, so CRIU maps them and leaves their pages zero.

fill (restore, between `criu restore --leave-stopped` and resuming the tree): many threads each take one
CHUNK_BYTES chunk of a raw file, hash it block by block while writing the blocks' extent bytes into
`/proc/<pid>/mem` of the stopped process (straight from an mmap of the file: no user-space copy; pwrite
and sha256 release the GIL), and compare the chunk's digest with the manifest's. A bad chunk raises
ArtifactError naming it and its byte offset; any failure stops the other threads, and the caller kills
the tree, which has never run with the bytes.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import ctypes.util
import errno
import hashlib
import mmap
import os
import re
import stat
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from podsnap.engine._criu_images import Pagemap, PagemapEntry, Vma, read_pagemap, read_vmas, write_pagemap
from podsnap.engine._manifest import BULK_DIR, CHUNK_BYTES, CRIU_DIR, Extent, FileEntry
from podsnap.engine.errors import ArtifactError

#: runs shorter than this stay in CRIU's image (a run of adjacent pagemap entries, each <= 1 MiB)
DEFAULT_MIN_RUN = 4 << 20
#: hashed then written in blocks this size: the block is still in cache when pwrite reads it again
BLOCK = 1 << 20
_PAGEMAP = re.compile(r"pagemap-([0-9]+)\.img")

# --- cut (capture) ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Run:
    vaddr: int
    length: int
    offset: int


def _eligible(vmas: list[Vma]) -> Callable[[PagemapEntry], bool]:
    """Is an entry wholly inside plain anonymous rw memory? CRIU's entries do not stop at VMA boundaries
    (one may start in the VMA below a region), so adjacent eligible VMAs count as one span."""
    spans: list[list[int]] = []
    for v in sorted((v for v in vmas if v.anon_private_rw), key=lambda v: v.start):
        if spans and spans[-1][1] == v.start:
            spans[-1][1] = v.end
        else:
            spans.append([v.start, v.end])
    starts = [s[0] for s in spans]

    def inside(e: PagemapEntry) -> bool:
        i = bisect.bisect_right(starts, e.vaddr) - 1
        return i >= 0 and e.vaddr + e.length <= spans[i][1]

    return inside


def find_runs(entries: tuple[PagemapEntry, ...], vmas: list[Vma] | None, min_run: int) -> tuple[list[_Run], list[int]]:
    """(runs to cut, indexes of the entries they cover): maximal sequences of consecutive present entries,
    adjacent in memory and inside plain anonymous read-write VMAs, of at least `min_run` bytes.
    `vmas=None` counts every mapping as eligible (to see how much a stricter rule leaves behind)."""
    eligible = _eligible(vmas) if vmas is not None else (lambda _e: True)
    runs: list[_Run] = []
    covered: list[int] = []
    current: list[int] = []  # indexes of the run being built
    run_offset = 0  # where its first entry's pages start in the pages image

    def close() -> None:
        if current:
            first, last = entries[current[0]], entries[current[-1]]
            length = last.vaddr + last.length - first.vaddr
            if length >= min_run:
                runs.append(_Run(first.vaddr, length, run_offset))
                covered.extend(current)
            current.clear()

    offset = 0  # pages of present entries lie back to back in the pages image, in entry order
    for i, e in enumerate(entries):
        if e.present and e.nr_pages > 0 and eligible(e):
            prev = entries[current[-1]] if current else None
            if prev is not None and prev.vaddr + prev.length != e.vaddr:
                close()
            if not current:
                run_offset = offset
            current.append(i)
        else:
            close()
        if e.present:
            offset += e.length
    close()
    return runs, covered


def _copy_range(src: int, dst: int, offset: int, length: int) -> None:
    """Append bytes [offset, offset + length) of `src` to `dst`, in the kernel where it can."""
    while length > 0:
        try:
            n = os.copy_file_range(src, dst, length, offset)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            n = os.write(dst, os.pread(src, min(length, BLOCK), offset))
        if n <= 0:
            raise OSError(f"copying the pages CRIU keeps stopped with {length} bytes left")
        offset += n
        length -= n


_FALLOC_FL_KEEP_SIZE, _FALLOC_FL_PUNCH_HOLE = 0x01, 0x02


def _punch(fd: int, ranges: list[tuple[int, int]]) -> None:
    """Give back the space of bytes a raw file no longer needs (they stay readable, as zeros); best effort."""
    libc_name = ctypes.util.find_library("c")
    if not libc_name or not ranges:
        return
    libc = ctypes.CDLL(libc_name, use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    for offset, length in ranges:
        if libc.fallocate(fd, _FALLOC_FL_KEEP_SIZE | _FALLOC_FL_PUNCH_HOLE, offset, length) != 0:
            return  # not supported here (some network filesystems): the bytes just stay


def _split(criu_dir: Path, raw: Path, pagemap_path: Path, pagemap: Pagemap, cut: list[int]) -> None:
    """CRIU's pages image becomes `raw`; a new pages image and pagemap keep only the entries not cut."""
    pages = criu_dir / f"pages-{pagemap.pages_id}.img"
    pages.rename(raw)
    keep: list[PagemapEntry] = []
    kept_ranges: list[tuple[int, int]] = []
    cut_set = set(cut)
    offset = 0
    for i, e in enumerate(pagemap.entries):
        if i not in cut_set:
            keep.append(e)
            if e.present:
                kept_ranges.append((offset, e.length))
        if e.present:
            offset += e.length
    src = os.open(raw, os.O_RDWR | os.O_CLOEXEC)
    try:
        dst = os.open(pages, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            for start, length in kept_ranges:
                _copy_range(src, dst, start, length)
        finally:
            os.close(dst)
        _punch(src, kept_ranges)
    finally:
        os.close(src)
    tmp = pagemap_path.with_name(f".{pagemap_path.name}.tmp")
    write_pagemap(tmp, pagemap, keep)
    tmp.replace(pagemap_path)


@dataclass(frozen=True)
class Cut:
    extents: list[Extent]
    #: bytes of all runs of at least `min_run`, whatever their mapping: what is left of it stayed in
    #: CRIU's images because its mapping is not plain anonymous rw memory (shown by progress and benches)
    large_bytes: int


def cut(staging: Path, criu_pids: set[int], *, min_run: int = DEFAULT_MIN_RUN) -> Cut:
    """Move the large memory runs of every process in `criu_pids` (CRIU's own numbering) out of the
    images in `staging/criu` into `staging/bulk`; return their extents (empty: nothing worth moving)."""
    criu_dir, bulk_dir = staging / CRIU_DIR, staging / BULK_DIR
    plans: list[tuple[int, Path, Pagemap, list[_Run], list[int]]] = []
    seen_pages: set[int] = set()
    large = 0
    for path in sorted(criu_dir.iterdir()):
        m = _PAGEMAP.fullmatch(path.name)
        if not m or int(m.group(1)) not in criu_pids:
            continue
        pid = int(m.group(1))
        pagemap = read_pagemap(path)
        if pagemap.pages_id in seen_pages:  # never split one pages image for two pagemaps
            return Cut([], 0)
        seen_pages.add(pagemap.pages_id)
        large += sum(r.length for r in find_runs(pagemap.entries, None, min_run)[0])
        runs, covered = find_runs(pagemap.entries, read_vmas(criu_dir / f"mm-{pid}.img"), min_run)
        if runs:
            plans.append((pid, path, pagemap, runs, covered))
    extents: list[Extent] = []
    for pid, path, pagemap, runs, covered in plans:
        bulk_dir.mkdir(exist_ok=True)
        raw = bulk_dir / f"pages-{pagemap.pages_id}.raw"
        _split(criu_dir, raw, path, pagemap, covered)
        rel = f"{BULK_DIR}/{raw.name}"
        extents += [Extent(pid=pid, vaddr=r.vaddr, length=r.length, file=rel, offset=r.offset) for r in runs]
    return Cut(extents, large)


# --- fill (restore) --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Piece:
    """Bytes [offset, offset + length) of a raw file go to `vaddr` of the process behind `mem`."""

    offset: int
    length: int
    mem: int
    vaddr: int


@dataclass(frozen=True)
class _Chunk:
    file: str
    index: int
    start: int
    end: int
    digest: str
    pieces: tuple[_Piece, ...]


def _chunks(extents: tuple[Extent, ...], files: Mapping[str, FileEntry], mems: Mapping[int, int]) -> list[_Chunk]:
    """One task per CHUNK_BYTES chunk of a raw file that holds extent bytes, with the pieces it writes."""
    pieces: dict[tuple[str, int], list[_Piece]] = {}
    for e in extents:
        pos, end = e.offset, e.offset + e.length
        while pos < end:
            index = pos // CHUNK_BYTES
            stop = min(end, (index + 1) * CHUNK_BYTES)
            pieces.setdefault((e.file, index), []).append(
                _Piece(pos, stop - pos, mems[e.pid], e.vaddr + pos - e.offset)
            )
            pos = stop
    out = []
    for (name, index), ps in sorted(pieces.items()):
        entry = files[name]
        digest = entry.chunks[index] if entry.chunks else entry.sha256
        start = index * CHUNK_BYTES
        out.append(_Chunk(name, index, start, min(entry.size, start + CHUNK_BYTES), digest, tuple(ps)))
    return out


def _write(mem: int, view: memoryview, vaddr: int) -> None:
    done = 0
    while done < len(view):
        n = os.pwrite(mem, view[done:], vaddr + done)
        if n <= 0:
            raise OSError(f"writing process memory at {vaddr + done:#x} wrote nothing")
        done += n


def _fill_chunk(chunk: _Chunk, data: mmap.mmap, stop: threading.Event, where: Path) -> int:
    """Hash the chunk block by block, writing each block's extent bytes as it goes; raise on a bad digest."""
    h = hashlib.sha256()
    view = memoryview(data)
    try:
        for block in range(chunk.start, chunk.end, BLOCK):
            if stop.is_set():
                return 0
            block_end = min(block + BLOCK, chunk.end)
            h.update(view[block:block_end])
            for p in chunk.pieces:
                lo, hi = max(p.offset, block), min(p.offset + p.length, block_end)
                if lo < hi:
                    _write(p.mem, view[lo:hi], p.vaddr + lo - p.offset)
    finally:
        view.release()
    if h.hexdigest() != chunk.digest:
        raise ArtifactError(
            f"{where / chunk.file}: chunk {chunk.index} (bytes {chunk.start}..{chunk.end}) has sha256 "
            f"{h.hexdigest()[:16]}…, not the manifest's {chunk.digest[:16]}… (tampered or corrupted)",
            path=str(where / chunk.file),
        )
    return sum(p.length for p in chunk.pieces)


@contextlib.contextmanager
def _mapped(artifact: Path, files: Mapping[str, FileEntry], names: list[str]) -> Iterator[dict[str, mmap.mmap]]:
    maps: dict[str, mmap.mmap] = {}
    try:
        for name in names:
            path = artifact / name
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode) or st.st_size != files[name].size:
                    raise ArtifactError(f"{path}: changed since it was verified (size or type)", path=str(path))
                maps[name] = mmap.mmap(fd, st.st_size, prot=mmap.PROT_READ)
            finally:
                os.close(fd)
        yield maps
    finally:
        for m in maps.values():
            m.close()


@contextlib.contextmanager
def _memories(host_pids: Mapping[int, int]) -> Iterator[dict[int, int]]:
    """criu pid -> an fd of /proc/<host pid>/mem, open for writing."""
    fds: dict[int, int] = {}
    try:
        for criu_pid, host_pid in host_pids.items():
            fds[criu_pid] = os.open(f"/proc/{host_pid}/mem", os.O_RDWR | os.O_CLOEXEC)
        yield fds
    finally:
        for fd in fds.values():
            os.close(fd)


def fill(
    artifact: Path,
    extents: tuple[Extent, ...],
    files: Mapping[str, FileEntry],
    host_pids: Mapping[int, int],
    *,
    workers: int,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Write every extent into its (stopped) process; `host_pids` maps CRIU's pid to the host pid now.
    Returns the bytes written. `progress(done, total)` runs on this thread after each chunk; if it raises,
    the fill stops like on any other failure (the workers finish their current block, nothing more)."""
    total = sum(e.length for e in extents)
    names = sorted({e.file for e in extents})
    stop = threading.Event()
    done = 0
    with _mapped(artifact, files, names) as maps, _memories(host_pids) as mems:
        tasks = _chunks(extents, files, mems)
        with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="podsnap-fill") as pool:
            pending: set[Future[int]] = {pool.submit(_fill_chunk, c, maps[c.file], stop, artifact) for c in tasks}
            try:
                while pending:
                    finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        done += fut.result()
                    if progress is not None:
                        progress(done, total)
            except BaseException:
                stop.set()
                for fut in pending:
                    fut.cancel()
                raise
    return done
