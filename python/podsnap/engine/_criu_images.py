"""Just enough of CRIU's image format to move bulk memory out of it: pagemaps and the VMAs of `mm-N.img`.

An image file is two little-endian u32 magics (IMG_COMMON_MAGIC, then the image's own), followed by
records: a u32 length, then that many bytes of one protobuf message. Messages (CRIU 4.2's
`images/pagemap.proto`, `mm.proto`, `vma.proto`)::

    pagemap_head  { uint32 pages_id = 1; }                 first record of pagemap-N.img
    pagemap_entry { uint64 vaddr = 1; uint32 compat_nr_pages = 2; bool in_parent = 3;
                    uint32 flags = 4; uint64 nr_pages = 5; }
    mm_entry      { ... repeated vma_entry vmas = 14; ... }  the one record of mm-N.img
    vma_entry     { uint64 start = 1; uint64 end = 2; ... uint32 prot = 5; uint32 flags = 6;
                    uint32 status = 7; ... }

The pages of a pagemap's entries that are PE_PRESENT lie back to back in `pages-<pages_id>.img`
(a raw file, no header), in entry order; CRIU 4.2 counts them in `nr_pages` (field 5) and writes 0 in
`compat_nr_pages`, while older images have only field 2 (CRIU's own `init_compat_pagemap_entry`).
Records are only ever dropped or copied verbatim here, never re-encoded, so what CRIU reads back is
byte for byte what it wrote.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
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


def fields(msg: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of every field of one protobuf message, in order."""
    i = 0
    while i < len(msg):
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
        yield number, wire, value


def _ints(msg: bytes) -> dict[int, int]:
    return {n: v for n, w, v in fields(msg) if w != 2 and isinstance(v, int)}


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

    @property
    def anon_private_rw(self) -> bool:
        """Plain private anonymous read-write memory: what a write through /proc/PID/mem fills exactly."""
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
    vmas = []
    for number, wire, value in fields(records[0]):
        if number == 14 and wire == 2 and isinstance(value, bytes):
            f = _ints(value)
            if 1 not in f or 2 not in f:
                raise ImageError(f"{path.name}: vma entry without start or end")
            vmas.append(Vma(start=f[1], end=f[2], prot=f.get(5, 0), status=f.get(7, 0)))
    return sorted(vmas, key=lambda v: v.start)
