"""The fast restore's two halves: bulk memory cut out of CRIU's images at capture, written back in parallel.

CRIU restores pages with one thread (≈1.8 GiB/s on the H200), and a CUDA worker's image is mostly one
thing: the host copy of its GPU memory, a few huge runs of private anonymous pages. So:

cut (capture, after the dump): for each process, the runs of present pages of at least `min_run` bytes
inside plain private anonymous read-write VMAs leave CRIU's image (CRIU restores what stays with one
thread, and the restore verifies those files before CRIU runs: the less stays, the better; small runs
only cost manifest lines). The original `pages-N.img` is renamed
to `bulk/pages-N.raw` (no copy of the bulk, not a byte changed: digests taken while CRIU wrote it stay
valid), and a new small `pages-N.img` + `pagemap-N.img` keep only the rest (a copy of the small
remainder, whose bytes stay unread in the raw file too). Each run becomes an extent (pid, vaddr, length, file, offset). Nothing else changes:
the VMAs stay in `mm-N.img`, so CRIU maps them and leaves their pages zero. With `hugepages`, the VMAs
that are mostly bulk get MADV_HUGEPAGE added in `mm-N.img` (see `advise_hugepages`): CRIU's restorer
advises them, so the fill faults 2 MiB pages and the CUDA driver's restore reads THP-backed memory
(THP "madvise" is the common host setting; with "always" it changes nothing, with "never" nothing either).

fill (restore, between `criu restore --leave-stopped` and resuming the tree): many threads each take one
CHUNK_BYTES chunk of a raw file, read it block by block into a private buffer, hash each block and write
its extent bytes from that buffer into the stopped process (`_procmem`: process_vm_writev; preadv,
the hash and the write release the GIL), and compare the chunk's digest with the manifest's. A bad chunk
raises ArtifactError naming it and its byte offset; any failure stops the other threads, and the caller
kills the tree, which has never run with the bytes. When the caller vouches for the files' digests
(`verified`: a node-local copy checked when it was cached), the bytes go straight from a mapping of the
file, unhashed.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import ctypes.util
import errno
import os
import re
import stat
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from podsnap.engine import _digest
from podsnap.engine._criu_images import (
    Pagemap,
    PagemapEntry,
    Vma,
    advise_hugepages,
    read_pagemap,
    read_vmas,
    write_pagemap,
)
from podsnap.engine._manifest import BULK_DIR, CHUNK_BYTES, CRIU_DIR, Extent, FileEntry
from podsnap.engine._procmem import Method, ProcessMemory, map_readonly, unmap
from podsnap.engine.errors import ArtifactError

#: runs shorter than this stay in CRIU's image (a run of adjacent pagemap entries, each <= 1 MiB)
DEFAULT_MIN_RUN = 256 << 10
#: a VMA gets MADV_HUGEPAGE when bulk runs cover at least half of it, and at least one huge page
HUGEPAGE = 2 << 20
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
    src = os.open(raw, os.O_RDONLY | os.O_CLOEXEC)
    try:
        dst = os.open(pages, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            for start, length in kept_ranges:
                _copy_range(src, dst, start, length)
        finally:
            os.close(dst)
    finally:
        os.close(src)
    tmp = pagemap_path.with_name(f".{pagemap_path.name}.tmp")
    write_pagemap(tmp, pagemap, keep)
    tmp.replace(pagemap_path)


def _mostly_bulk(runs: list[_Run]) -> Callable[[Vma], bool]:
    """Do the runs cover at least half of a VMA, and at least one huge page of it?"""
    runs = sorted(runs, key=lambda r: r.vaddr)
    starts = [r.vaddr for r in runs]

    def covered(v: Vma) -> bool:
        i = max(0, bisect.bisect_right(starts, v.start) - 1)
        inside = 0
        while i < len(runs) and runs[i].vaddr < v.end:
            inside += max(0, min(v.end, runs[i].vaddr + runs[i].length) - max(v.start, runs[i].vaddr))
            i += 1
        return inside >= max(HUGEPAGE, (v.end - v.start) // 2)

    return covered


@dataclass(frozen=True)
class Cut:
    extents: list[Extent]
    #: bytes of all runs of at least `min_run`, whatever their mapping: what is left of it stayed in
    #: CRIU's images because its mapping is not plain anonymous rw memory (shown by progress and benches)
    large_bytes: int
    #: bytes of the VMAs given MADV_HUGEPAGE in their mm image
    advised_bytes: int = 0
    #: artifact-relative path of each pages image now under bulk/ -> its new path (its bytes unchanged)
    moved: dict[str, str] = field(default_factory=dict)
    #: artifact-relative paths of the CRIU images the cut wrote anew (pagemaps, the pages images left,
    #: mm images it advised): digests taken of them before the cut no longer hold
    rewritten: frozenset[str] = frozenset()


def cut(staging: Path, criu_pids: set[int], *, min_run: int = DEFAULT_MIN_RUN, hugepages: bool = True) -> Cut:
    """Move the large memory runs of every process in `criu_pids` (CRIU's own numbering) out of the
    images in `staging/criu` into `staging/bulk`; return their extents (empty: nothing worth moving).
    `hugepages`: advise MADV_HUGEPAGE on the VMAs the runs mostly fill (only ever adds that bit)."""
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
    advised = 0
    moved: dict[str, str] = {}
    rewritten: set[str] = set()
    for pid, path, pagemap, runs, covered in plans:
        bulk_dir.mkdir(exist_ok=True)
        raw = bulk_dir / f"pages-{pagemap.pages_id}.raw"
        _split(criu_dir, raw, path, pagemap, covered)
        rel = f"{BULK_DIR}/{raw.name}"
        moved[f"{CRIU_DIR}/pages-{pagemap.pages_id}.img"] = rel
        rewritten |= {f"{CRIU_DIR}/pages-{pagemap.pages_id}.img", f"{CRIU_DIR}/{path.name}"}
        extents += [Extent(pid=pid, vaddr=r.vaddr, length=r.length, file=rel, offset=r.offset) for r in runs]
        if hugepages:
            vmas = advise_hugepages(criu_dir / f"mm-{pid}.img", _mostly_bulk(runs))
            advised += sum(v.end - v.start for v in vmas)
            if vmas:
                rewritten.add(f"{CRIU_DIR}/mm-{pid}.img")
    return Cut(extents, large, advised, moved, frozenset(rewritten))


# --- fill (restore) --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Piece:
    """Bytes [offset, offset + length) of a raw file go to `vaddr` of the process behind `target`."""

    offset: int
    length: int
    target: ProcessMemory
    vaddr: int


@dataclass(frozen=True)
class _Chunk:
    file: str
    index: int
    start: int
    end: int
    digest: str
    pieces: tuple[_Piece, ...]


def _chunks(
    extents: tuple[Extent, ...], files: Mapping[str, FileEntry], targets: Mapping[int, ProcessMemory]
) -> list[_Chunk]:
    """One task per CHUNK_BYTES chunk of a raw file that holds extent bytes, with the pieces it writes."""
    pieces: dict[tuple[str, int], list[_Piece]] = {}
    for e in extents:
        pos, end = e.offset, e.offset + e.length
        while pos < end:
            index = pos // CHUNK_BYTES
            stop = min(end, (index + 1) * CHUNK_BYTES)
            pieces.setdefault((e.file, index), []).append(
                _Piece(pos, stop - pos, targets[e.pid], e.vaddr + pos - e.offset)
            )
            pos = stop
    out = []
    for (name, index), ps in sorted(pieces.items()):
        entry = files[name]
        digest = entry.chunks[index] if entry.chunks else entry.digest
        start = index * CHUNK_BYTES
        out.append(_Chunk(name, index, start, min(entry.size, start + CHUNK_BYTES), digest, tuple(ps)))
    return out


class _Buffer:
    """A thread's private block buffer: what is hashed is what is written (nobody else can change it)."""

    def __init__(self) -> None:
        self.mem = (ctypes.c_char * BLOCK)()
        self.addr = ctypes.addressof(self.mem)
        self.view = memoryview(self.mem).cast("B")


def _read_block(fd: int, view: memoryview, offset: int, where: Path) -> None:
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise ArtifactError(f"{where}: ended at byte {offset + done}, shorter than verified", path=str(where))
        done += n


def _check_targets(chunk: _Chunk) -> None:
    for target in {id(p.target): p.target for p in chunk.pieces}.values():
        if not target.alive():
            raise OSError(f"restored pid {target.pid} exited while its memory was being filled")


def _fill_chunk(chunk: _Chunk, fd: int, buf: _Buffer, stop: threading.Event, where: Path, *, algorithm: str) -> int:
    """Read the chunk block by block into `buf`, hash each block and write its extent bytes from `buf`;
    raise on a bad digest (the tree has not run: the caller kills it)."""
    h = _digest.new(algorithm)
    path = where / chunk.file
    for block in range(chunk.start, chunk.end, BLOCK):
        if stop.is_set():
            return 0
        block_end = min(block + BLOCK, chunk.end)
        view = buf.view[: block_end - block]
        _read_block(fd, view, block, path)
        h.update(view)
        for p in chunk.pieces:
            lo, hi = max(p.offset, block), min(p.offset + p.length, block_end)
            if lo < hi:
                p.target.write(p.vaddr + lo - p.offset, buf.addr + lo - block, hi - lo)
    if h.hexdigest() != chunk.digest:
        raise ArtifactError(
            f"{path}: chunk {chunk.index} (bytes {chunk.start}..{chunk.end}) has {algorithm} "
            f"{h.hexdigest()[:16]}…, not the manifest's {chunk.digest[:16]}… (tampered or corrupted)",
            path=str(path),
        )
    _check_targets(chunk)
    return sum(p.length for p in chunk.pieces)


def _copy_chunk(chunk: _Chunk, base: int, stop: threading.Event) -> int:
    """Write the chunk's extent bytes straight from the file's mapping (verified_digests: no hashing)."""
    for p in chunk.pieces:
        if stop.is_set():
            return 0
        p.target.write(p.vaddr, base + p.offset, p.length)
    _check_targets(chunk)
    return sum(p.length for p in chunk.pieces)


@dataclass
class _Source:
    fd: int
    size: int
    #: the file's read-only shared mapping, only when its bytes are trusted without hashing
    base: int = 0


@contextlib.contextmanager
def _sources(
    artifact: Path, files: Mapping[str, FileEntry], names: list[str], *, mapped: bool
) -> Iterator[dict[str, _Source]]:
    out: dict[str, _Source] = {}
    try:
        for name in names:
            path = artifact / name
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            src = out[name] = _Source(fd, files[name].size)
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size != src.size:
                raise ArtifactError(f"{path}: changed since it was verified (size or type)", path=str(path))
            if mapped and src.size:
                src.base = map_readonly(fd, src.size)
        yield out
    finally:
        for src in out.values():
            if src.base:
                unmap(src.base, src.size)
            os.close(src.fd)


@contextlib.contextmanager
def _targets(host_pids: Mapping[int, int], method: Method) -> Iterator[dict[int, ProcessMemory]]:
    """criu pid -> write access to the memory of its host pid."""
    out: dict[int, ProcessMemory] = {}
    try:
        for criu_pid, host_pid in host_pids.items():
            out[criu_pid] = ProcessMemory(host_pid, method=method)
        yield out
    finally:
        for t in out.values():
            t.close()


def fill(
    artifact: Path,
    extents: tuple[Extent, ...],
    files: Mapping[str, FileEntry],
    host_pids: Mapping[int, int],
    *,
    workers: int,
    progress: Callable[[int, int], None] | None = None,
    verified: bool = False,
    method: Method = "auto",
    algorithm: str,
) -> int:
    """Write every extent into its (stopped) process; `host_pids` maps CRIU's pid to the host pid now.
    Returns the bytes written. `progress(done, total)` runs on this thread after each chunk; if it raises,
    the fill stops like on any other failure (the workers finish their current block, nothing more).

    Each chunk is read into a private buffer, hashed and written from there, so the bytes checked are
    the bytes written even if someone rewrites the file meanwhile. `verified=True` (the caller vouches
    for the files' digests, RestoreOptions.verified_digests) writes straight from a mapping of the file
    and checks nothing but sizes. `algorithm` is the manifest's digest algorithm."""
    total = sum(e.length for e in extents)
    names = sorted({e.file for e in extents})
    stop = threading.Event()
    done = 0
    local = threading.local()

    def run(chunk: _Chunk, src: _Source) -> int:
        if verified:
            return _copy_chunk(chunk, src.base, stop)
        buf = getattr(local, "buf", None)
        if buf is None:
            buf = local.buf = _Buffer()
        return _fill_chunk(chunk, src.fd, buf, stop, artifact, algorithm=algorithm)

    with _sources(artifact, files, names, mapped=verified) as sources, _targets(host_pids, method) as targets:
        tasks = _chunks(extents, files, targets)
        with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="podsnap-fill") as pool:
            pending: set[Future[int]] = {pool.submit(run, c, sources[c.file]) for c in tasks}
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
