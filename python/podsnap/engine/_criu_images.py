"""Just enough of CRIU's image format to move bulk memory out of it: pagemaps and the VMAs of `mm-N.img`.

An image file is two little-endian u32 magics (IMG_COMMON_MAGIC, then the image's own), followed by
records: a u32 length, then that many bytes of one protobuf message. Messages (CRIU 4.2's
`images/pagemap.proto`, `mm.proto`, `vma.proto`)::

    pagemap_head  { uint32 pages_id = 1; }                 first record of pagemap-N.img
    pagemap_entry { uint64 vaddr = 1; uint32 compat_nr_pages = 2; bool in_parent = 3;
                    uint32 flags = 4; uint64 nr_pages = 5; }
    mm_entry      { ... repeated vma_entry vmas = 14; ... }  the one record of mm-N.img
    vma_entry     { uint64 start = 1; uint64 end = 2; ... uint32 prot = 5; uint32 flags = 6;
                    uint32 status = 7; ... uint64 madv = 9; ... }

The pages of a pagemap's entries that are PE_PRESENT lie back to back in `pages-<pages_id>.img`
(a raw file, no header), in entry order; CRIU 4.2 counts them in `nr_pages` (field 5) and writes 0 in
`compat_nr_pages`, while older images have only field 2 (CRIU's own `init_compat_pagemap_entry`).
Records are dropped or copied verbatim, never re-encoded, so what CRIU reads back is byte for byte
what it wrote - with one exception, `advise_hugepages`: it adds the MADV_HUGEPAGE bit to the `madv`
bitmap of chosen VMAs (the rest of each record, and every other record, stays byte for byte). `madv` is
a bitmap indexed by MADV_* number that CRIU fills from the VmFlags of /proc/PID/smaps at dump and
replays at the very end of its restorer (`sys_madvise(start, len, bit)` for every set bit of a
VMA_AREA_REGULAR VMA), after the pages it restores itself and before `--leave-stopped` stops the task.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

IMG_COMMON_MAGIC = 0x54564319
PAGEMAP_MAGIC = 0x56084025
MM_MAGIC = 0x57492820
PAGE_SIZE = 4096

PE_PARENT = 1 << 0
PE_LAZY = 1 << 1
PE_PRESENT = 1 << 2

PROT_READ, PROT_WRITE = 0x1, 0x2
MADV_HUGEPAGE, MADV_NOHUGEPAGE = 14, 15
VMA_AREA_REGULAR = 1 << 0
VMA_ANON_PRIVATE = 1 << 9
#: VMAs CRIU treats specially (vDSO, guard pages, shadow stacks, device memory a plugin owns, ...)
VMA_SPECIAL = (
    (1 << 2)  # VSYSCALL
    | (1 << 3)  # VDSO
    | (1 << 10)  # SYSVIPC
    | (1 << 11)  # SOCKET
    | (1 << 12)  # VVAR
    | (1 << 13)  # AIORING
    | (1 << 14)  # MEMFD
    | (1 << 15)  # SHSTK
    | (1 << 16)  # GUARD
    | (1 << 17)  # UPROBES
    | (1 << 27)  # EXT_PLUGIN
    | (1 << 31)  # UNSUPP
)


class ImageError(ValueError):
    """An image is not what this reader expects (wrong magic, truncated record, bad protobuf)."""


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise ImageError("truncated or oversized varint")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, i


def _walk(msg: bytes) -> Iterator[tuple[int, int, int | bytes, int, int]]:
    """(field number, wire type, value, start, end) of every field of one protobuf message, in order;
    [start, end) are the field's bytes, key included."""
    i = 0
    while i < len(msg):
        start = i
        key, i = _varint(msg, i)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, i = _varint(msg, i)
        elif wire == 1:
            value, i = int.from_bytes(msg[i : i + 8], "little"), i + 8
        elif wire == 2:
            size, i = _varint(msg, i)
            value, i = msg[i : i + size], i + size
        elif wire == 5:
            value, i = int.from_bytes(msg[i : i + 4], "little"), i + 4
        else:
            raise ImageError(f"unsupported protobuf wire type {wire}")
        if i > len(msg):
            raise ImageError("truncated protobuf field")
        yield number, wire, value, start, i


def fields(msg: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of every field of one protobuf message, in order."""
    for number, wire, value, _, _ in _walk(msg):
        yield number, wire, value


def _ints(msg: bytes) -> dict[int, int]:
    return {n: v for n, w, v in fields(msg) if w != 2 and isinstance(v, int)}


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        out.append(b | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _set_varint_field(msg: bytes, number: int, value: int) -> bytes:
    """`msg` with varint field `number` set to `value`: every other field byte for byte, in order; the
    field where it was, or before the first field numbered above it."""
    new = _encode_varint(number << 3) + _encode_varint(value)
    out, placed = bytearray(), False
    for n, _, _, start, end in list(_walk(msg)):
        if n == number:
            if not placed:
                out += new
                placed = True
            continue
        if n > number and not placed:
            out += new
            placed = True
        out += msg[start:end]
    if not placed:
        out += new
    return bytes(out)


def read_records(path: Path, magic: int) -> tuple[bytes, list[bytes]]:
    """(the 8-byte header, every record's message bytes) of the image at `path`."""
    data = path.read_bytes()
    if len(data) < 8 or struct.unpack_from("<II", data) != (IMG_COMMON_MAGIC, magic):
        raise ImageError(f"{path.name}: not a CRIU image with magic {magic:#x}")
    records, i = [], 8
    while i < len(data):
        if i + 4 > len(data):
            raise ImageError(f"{path.name}: truncated record header at byte {i}")
        (size,) = struct.unpack_from("<I", data, i)
        if i + 4 + size > len(data):
            raise ImageError(f"{path.name}: truncated record at byte {i}")
        records.append(data[i + 4 : i + 4 + size])
        i += 4 + size
    return data[:8], records


def write_records(path: Path, header: bytes, records: list[bytes]) -> None:
    with path.open("wb") as f:
        f.write(header)
        for rec in records:
            f.write(struct.pack("<I", len(rec)))
            f.write(rec)


@dataclass(frozen=True)
class PagemapEntry:
    vaddr: int
    nr_pages: int
    flags: int
    #: the record as CRIU wrote it (copied verbatim when the entry stays)
    raw: bytes

    @property
    def present(self) -> bool:
        """Its pages are in this pagemap's pages image (and advance the read offset there)."""
        return bool(self.flags & PE_PRESENT)

    @property
    def length(self) -> int:
        return self.nr_pages * PAGE_SIZE

    @classmethod
    def parse(cls, raw: bytes) -> PagemapEntry:
        f = _ints(raw)
        if 1 not in f:
            raise ImageError("pagemap entry without vaddr")
        if f.get(3):  # in_parent (old images)
            flags = PE_PARENT
        elif 4 in f:
            flags = f[4]
        else:
            flags = PE_PRESENT
        return cls(vaddr=f[1], nr_pages=f.get(5, f.get(2, 0)), flags=flags, raw=raw)


@dataclass(frozen=True)
class Pagemap:
    header: bytes
    #: the pagemap_head record (verbatim) and the pages image it names
    head: bytes
    pages_id: int
    entries: tuple[PagemapEntry, ...]


def read_pagemap(path: Path) -> Pagemap:
    header, records = read_records(path, PAGEMAP_MAGIC)
    if not records:
        raise ImageError(f"{path.name}: no pagemap head")
    head = _ints(records[0])
    if 1 not in head:
        raise ImageError(f"{path.name}: pagemap head without pages_id")
    return Pagemap(header, records[0], head[1], tuple(PagemapEntry.parse(r) for r in records[1:]))


def write_pagemap(path: Path, pagemap: Pagemap, entries: list[PagemapEntry]) -> None:
    write_records(path, pagemap.header, [pagemap.head, *(e.raw for e in entries)])


@dataclass(frozen=True)
class Vma:
    start: int
    end: int
    prot: int
    status: int
    #: madvise bits CRIU replays at restore (bit n = MADV_* number n)
    madv: int = 0

    @property
    def anon_private_rw(self) -> bool:
        """Plain private anonymous read-write memory: what the fill writes exactly (process_vm_writev needs
        write permission; nothing special behind it)."""
        return (
            self.status & (VMA_AREA_REGULAR | VMA_ANON_PRIVATE) == VMA_AREA_REGULAR | VMA_ANON_PRIVATE
            and not self.status & VMA_SPECIAL
            and self.prot & (PROT_READ | PROT_WRITE) == PROT_READ | PROT_WRITE
        )


def read_vmas(path: Path) -> list[Vma]:
    """The VMAs of the process whose `mm-N.img` is at `path`, in address order."""
    _, records = read_records(path, MM_MAGIC)
    if len(records) != 1:
        raise ImageError(f"{path.name}: expected one mm entry, found {len(records)}")
    vmas = [
        _vma(value, path) for number, wire, value in fields(records[0]) if number == 14 and isinstance(value, bytes)
    ]
    return sorted(vmas, key=lambda v: v.start)


def _vma(body: bytes, path: Path) -> Vma:
    f = _ints(body)
    if 1 not in f or 2 not in f:
        raise ImageError(f"{path.name}: vma entry without start or end")
    return Vma(start=f[1], end=f[2], prot=f.get(5, 0), status=f.get(7, 0), madv=f.get(9, 0))


def advise_hugepages(path: Path, chosen: Callable[[Vma], bool]) -> list[Vma]:
    """Add MADV_HUGEPAGE to the VMAs of `mm-N.img` at `path` that are plain anonymous rw memory, not
    advised MADV_NOHUGEPAGE, and `chosen`; rewrite the image only when one changes. Returns those VMAs.

    Only that bit is added, nothing is removed: CRIU's restorer then asks the kernel for transparent
    huge pages on those mappings, so whoever faults their pages in after CRIU (the parallel fill, the
    CUDA driver's restore reading the host copy) gets 2 MiB pages where the kernel's THP mode allows."""
    header, records = read_records(path, MM_MAGIC)
    if len(records) != 1:
        raise ImageError(f"{path.name}: expected one mm entry, found {len(records)}")
    mm = records[0]
    advised: list[Vma] = []
    out = bytearray()
    for number, _, value, start, end in list(_walk(mm)):
        raw = mm[start:end]
        if number == 14 and isinstance(value, bytes):
            body = value
            vma = _vma(body, path)
            hint = 1 << MADV_HUGEPAGE | 1 << MADV_NOHUGEPAGE
            if vma.anon_private_rw and not vma.madv & hint and chosen(vma):
                body = _set_varint_field(body, 9, vma.madv | 1 << MADV_HUGEPAGE)
                raw = _encode_varint(14 << 3 | 2) + _encode_varint(len(body)) + body
                advised.append(vma)
        out += raw
    if advised:
        tmp = path.with_name(f".{path.name}.tmp")
        write_records(tmp, header, [bytes(out)])
        tmp.replace(path)
    return advised
