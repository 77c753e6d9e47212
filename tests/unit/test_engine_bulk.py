"""CRIU image codec and the bulk cut on hand-made images (the real ones are exercised in tests/engine).

The images are written here with a tiny protobuf encoder in the layout of CRIU 4.2's pagemap.proto and
mm.proto, so each rule of the cut can be shown on a few entries.
"""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import pytest

from podsnap.engine import _bulk as bulk
from podsnap.engine._criu_images import (
    IMG_COMMON_MAGIC,
    MM_MAGIC,
    PAGE_SIZE,
    PAGEMAP_MAGIC,
    PE_LAZY,
    PE_PARENT,
    PE_PRESENT,
    ImageError,
    PagemapEntry,
    Vma,
    read_pagemap,
    read_vmas,
)
from podsnap.engine._manifest import CHUNK_BYTES, Extent, FileEntry

MIB = 1 << 20
ANON_RW = (1 | 2, (1 << 0) | (1 << 9))  # prot READ|WRITE, status REGULAR|ANON_PRIVATE
FILE_PRIVATE = (1 | 2, (1 << 0) | (1 << 6))


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(number: int, value: int | bytes) -> bytes:
    if isinstance(value, bytes):
        return varint(number << 3 | 2) + varint(len(value)) + value
    return varint(number << 3) + varint(value)


def image(magic: int, records: list[bytes]) -> bytes:
    return struct.pack("<II", IMG_COMMON_MAGIC, magic) + b"".join(struct.pack("<I", len(r)) + r for r in records)


def entry(vaddr: int, pages: int, flags: int | None = PE_PRESENT | PE_LAZY) -> bytes:
    """A CRIU 4.2 record: page count in field 5, 0 in the old field 2."""
    out = field(1, vaddr) + field(2, 0)
    if flags is not None:
        out += field(4, flags)
    return out + field(5, pages)


def vma(start: int, end: int, prot_status: tuple[int, int]) -> bytes:
    prot, status = prot_status
    return field(14, field(1, start) + field(2, end) + field(3, 0) + field(4, 0) + field(5, prot) + field(7, status))


def test_entries_read_like_criu_reads_them_old_and_new() -> None:
    new = PagemapEntry.parse(entry(0x1000, 7))
    assert (new.vaddr, new.nr_pages, new.present) == (0x1000, 7, True)
    old = PagemapEntry.parse(field(1, 0x2000) + field(2, 3))  # before flags and field 5
    assert (old.nr_pages, old.present) == (3, True)
    parent = PagemapEntry.parse(field(1, 0x3000) + field(2, 3) + field(3, 1))
    assert parent.flags == PE_PARENT and not parent.present
    assert not PagemapEntry.parse(entry(0x4000, 1, flags=PE_LAZY)).present


def test_a_foreign_or_truncated_image_is_refused(tmp_path: Path) -> None:
    (tmp_path / "mm.img").write_bytes(image(MM_MAGIC, []))
    with pytest.raises(ImageError, match="magic"):
        read_pagemap(tmp_path / "mm.img")
    (tmp_path / "pm.img").write_bytes(image(PAGEMAP_MAGIC, [field(1, 1)])[:-1])
    with pytest.raises(ImageError, match="truncated"):
        read_pagemap(tmp_path / "pm.img")


def runs_of(
    entries: list[bytes], vmas: list[tuple[int, int, tuple[int, int]]], min_run: int
) -> list[tuple[int, int, int]]:
    parsed = tuple(PagemapEntry.parse(e) for e in entries)
    vm = [Vma(start=start, end=end, prot=prot, status=status) for start, end, (prot, status) in vmas]
    runs, _ = bulk.find_runs(parsed, vm, min_run)
    return [(r.vaddr, r.length, r.offset) for r in runs]


def test_adjacent_entries_coalesce_and_offsets_count_only_present_pages() -> None:
    base = 0x7F0000000000
    entries = [
        entry(0x1000, 1),  # small, elsewhere: stays, but its page shifts every offset after it
        entry(base, 256),
        entry(base + 256 * PAGE_SIZE, 256),
        entry(base + 512 * PAGE_SIZE, 256, flags=PE_PARENT),  # not in this image: breaks the run, no offset
        entry(base + 768 * PAGE_SIZE, 512),
    ]
    vmas = [(0x1000, 0x2000, ANON_RW), (base, base + 2048 * PAGE_SIZE, ANON_RW)]
    assert runs_of(entries, vmas, 2 * MIB) == [
        (base, 2 * MIB, PAGE_SIZE),
        (base + 768 * PAGE_SIZE, 2 * MIB, PAGE_SIZE + 2 * MIB),
    ]
    assert runs_of(entries, vmas, 3 * MIB) == [], "runs below the threshold stay in CRIU's image"


def test_an_entry_across_two_adjacent_anonymous_mappings_stays_in_the_run() -> None:
    """CRIU's entries do not stop at VMA boundaries: one may begin in the mapping below a region."""
    base = 0x7F0000000000
    entries = [entry(base - 8 * PAGE_SIZE, 195), entry(base + 187 * PAGE_SIZE, 256)]
    below, region = (base - MIB, base, ANON_RW), (base, base + 2 * MIB, ANON_RW)
    assert runs_of(entries, [below, region], MIB) == [(base - 8 * PAGE_SIZE, 451 * PAGE_SIZE, 0)]
    ro_below = (base - MIB, base, (1, ANON_RW[1]))
    assert runs_of(entries, [ro_below, region], MIB) == [(base + 187 * PAGE_SIZE, MIB, 195 * PAGE_SIZE)]
    parsed = tuple(PagemapEntry.parse(e) for e in entries)
    assert [r.length for r in bulk.find_runs(parsed, None, MIB)[0]] == [451 * PAGE_SIZE], "every mapping counts"


def test_a_gap_in_memory_or_a_non_anonymous_mapping_ends_a_run() -> None:
    base = 0x7F0000000000
    gap = [entry(base, 256), entry(base + 257 * PAGE_SIZE, 256)]
    assert runs_of(gap, [(base, base + 1024 * PAGE_SIZE, ANON_RW)], 2 * MIB) == []
    file_backed = [entry(base, 256), entry(base + 256 * PAGE_SIZE, 256)]
    assert runs_of(file_backed, [(base, base + 512 * PAGE_SIZE, FILE_PRIVATE)], MIB) == []
    read_only = [entry(base, 512)]
    assert runs_of(read_only, [(base, base + 512 * PAGE_SIZE, (1, ANON_RW[1]))], MIB) == []


def test_cut_moves_the_run_out_without_copying_it_and_criu_keeps_the_rest(tmp_path: Path) -> None:
    criu, pid, base = tmp_path / "criu", 42, 0x7F0000000000
    criu.mkdir()
    small = b"s" * PAGE_SIZE
    big = bytes(range(256)) * (2 * MIB // 256)
    tail = b"t" * PAGE_SIZE
    pages = small + big + tail
    records = [field(1, 7), entry(0x1000, 1), entry(base, 256), entry(base + MIB, 256), entry(0x9000, 1)]
    (criu / f"pagemap-{pid}.img").write_bytes(image(PAGEMAP_MAGIC, records))
    (criu / "pages-7.img").write_bytes(pages)
    mm = field(1, 0) + vma(0x1000, 0x2000, ANON_RW) + vma(base, base + 2 * MIB, ANON_RW) + vma(0x9000, 0xA000, ANON_RW)
    (criu / f"mm-{pid}.img").write_bytes(image(MM_MAGIC, [mm]))
    ino = (criu / "pages-7.img").stat().st_ino

    done = bulk.cut(tmp_path, {pid}, min_run=MIB)
    assert done.large_bytes == 2 * MIB
    assert done.extents == [Extent(pid=pid, vaddr=base, length=2 * MIB, file="bulk/pages-7.raw", offset=PAGE_SIZE)]
    raw = tmp_path / "bulk" / "pages-7.raw"
    assert raw.stat().st_ino == ino, "the original pages image was renamed, not copied"
    assert raw.read_bytes()[PAGE_SIZE : PAGE_SIZE + 2 * MIB] == big
    assert (criu / "pages-7.img").read_bytes() == small + tail
    kept = read_pagemap(criu / f"pagemap-{pid}.img")
    assert [(e.vaddr, e.nr_pages) for e in kept.entries] == [(0x1000, 1), (0x9000, 1)]
    assert kept.pages_id == 7 and kept.head == records[0], "records are copied verbatim"
    assert [v.start for v in read_vmas(criu / f"mm-{pid}.img")] == [0x1000, 0x9000, base]


def test_cut_leaves_processes_outside_the_tree_and_small_images_alone(tmp_path: Path) -> None:
    criu = tmp_path / "criu"
    criu.mkdir()
    (criu / "pagemap-5.img").write_bytes(image(PAGEMAP_MAGIC, [field(1, 1), entry(0x1000, 1)]))
    (criu / "pages-1.img").write_bytes(b"x" * PAGE_SIZE)
    (criu / "mm-5.img").write_bytes(image(MM_MAGIC, [vma(0x1000, 0x2000, ANON_RW)]))
    before = {p.name: p.read_bytes() for p in criu.iterdir()}
    assert bulk.cut(tmp_path, {5}, min_run=MIB) == bulk.Cut([], 0)
    assert bulk.cut(tmp_path, {6}, min_run=PAGE_SIZE) == bulk.Cut([], 0)
    assert {p.name: p.read_bytes() for p in criu.iterdir()} == before
    assert not (tmp_path / "bulk").exists()


def test_fill_tasks_follow_the_digest_chunks_of_the_raw_file() -> None:
    size = 2 * CHUNK_BYTES + 5 * PAGE_SIZE
    entry_ = FileEntry("bulk/pages-1.raw", size, "root", ("c0", "c1", "c2"))
    ext = Extent(pid=9, vaddr=0x10000000, length=CHUNK_BYTES + PAGE_SIZE, file=entry_.path, offset=CHUNK_BYTES // 2)
    tasks = bulk._chunks((ext,), {entry_.path: entry_}, {9: 3})
    assert [(t.index, t.digest, t.start, t.end) for t in tasks] == [
        (0, "c0", 0, CHUNK_BYTES),
        (1, "c1", CHUNK_BYTES, 2 * CHUNK_BYTES),
    ]
    pieces = [p for t in tasks for p in t.pieces]
    assert sum(p.length for p in pieces) == ext.length
    assert [p.vaddr for p in pieces] == [ext.vaddr, ext.vaddr + CHUNK_BYTES // 2]
    one = FileEntry("bulk/pages-2.raw", 3 * PAGE_SIZE, hashlib.sha256(b"").hexdigest())
    small = Extent(pid=9, vaddr=0x1000, length=PAGE_SIZE, file=one.path, offset=PAGE_SIZE)
    (task,) = bulk._chunks((small,), {one.path: one}, {9: 3})
    assert task.digest == one.digest and task.end == one.size, "a file of one chunk is checked by its own digest"


def vma_madv(start: int, end: int, prot_status: tuple[int, int], madv: int | None, fdflags: int | None = None) -> bytes:
    """A vma_entry record as CRIU writes it: madv (field 9) only when the mapping had advice, then fdflags."""
    prot, status = prot_status
    body = field(1, start) + field(2, end) + field(3, 0) + field(4, 0) + field(5, prot) + field(6, 0x22)
    body += field(7, status) + field(8, 1)
    if madv is not None:
        body += field(9, madv)
    if fdflags is not None:
        body += field(10, fdflags)
    return body


HUGE_TEST_PID, HUGE_TEST_BASE = 42, 0x7F0000000000
REGION = HUGE_TEST_BASE + 16 * MIB  # 8 MiB, all of it bulk
HALF = HUGE_TEST_BASE + 64 * MIB  # 8 MiB, 2 MiB of it bulk: stays as it was
NOHUGE = HUGE_TEST_BASE + 128 * MIB  # 4 MiB of bulk, but its owner asked for no huge pages
DONTDUMP = 1 << 16  # MADV_DONTDUMP: advice the cut must keep


def huge_test_images(root: Path) -> bytes:
    """Images of one process with three candidate mappings; returns its mm record."""
    criu = root / "criu"
    criu.mkdir(parents=True)
    entries = [entry(REGION, 2048), entry(HALF, 512), entry(NOHUGE, 1024)]
    (criu / f"pagemap-{HUGE_TEST_PID}.img").write_bytes(image(PAGEMAP_MAGIC, [field(1, 3), *entries]))
    (criu / "pages-3.img").write_bytes(bytes((8 + 2 + 4) * MIB))
    vmas = [
        vma_madv(0x1000, 0x2000, ANON_RW, None),
        vma_madv(REGION, REGION + 8 * MIB, ANON_RW, DONTDUMP, fdflags=2),
        vma_madv(HALF, HALF + 8 * MIB, ANON_RW, None),
        vma_madv(NOHUGE, NOHUGE + 4 * MIB, ANON_RW, 1 << 15),
    ]
    record = field(1, 7) + b"".join(field(14, v) for v in vmas) + field(20, b"tail")
    (criu / f"mm-{HUGE_TEST_PID}.img").write_bytes(image(MM_MAGIC, [record]))
    return record


def test_the_cut_advises_huge_pages_only_on_anonymous_mappings_the_bulk_mostly_fills(tmp_path: Path) -> None:
    before = huge_test_images(tmp_path)
    mm = tmp_path / "criu" / f"mm-{HUGE_TEST_PID}.img"
    done = bulk.cut(tmp_path, {HUGE_TEST_PID}, min_run=MIB)
    assert done.advised_bytes == 8 * MIB
    after = {v.start: v for v in read_vmas(mm)}
    assert after[REGION].madv == DONTDUMP | 1 << 14, "MADV_HUGEPAGE added, the other advice kept"
    assert after[HALF].madv == 0 and after[NOHUGE].madv == 1 << 15 and after[0x1000].madv == 0
    # only that vma_entry changed, its madv placed before fdflags as CRIU orders it; the rest verbatim
    advised = vma_madv(REGION, REGION + 8 * MIB, ANON_RW, DONTDUMP | 1 << 14, fdflags=2)
    old = vma_madv(REGION, REGION + 8 * MIB, ANON_RW, DONTDUMP, fdflags=2)
    assert mm.read_bytes() == image(MM_MAGIC, [before.replace(field(14, old), field(14, advised))])


def test_without_hugepages_the_cut_leaves_the_mm_image_byte_for_byte(tmp_path: Path) -> None:
    before = huge_test_images(tmp_path)
    assert bulk.cut(tmp_path, {HUGE_TEST_PID}, min_run=MIB, hugepages=False).advised_bytes == 0
    assert (tmp_path / "criu" / f"mm-{HUGE_TEST_PID}.img").read_bytes() == image(MM_MAGIC, [before])
