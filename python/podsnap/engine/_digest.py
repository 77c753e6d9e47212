"""The content digests of artifact files: which algorithm a manifest uses, and one way to compute them.

A restore hashes every byte of the bulk on its critical path (the fill checks each chunk as it writes
it), so the hash's speed per core is restore time. BLAKE3 is a 256-bit cryptographic hash that runs
about 3x faster than SHA-256 per core here (SIMD across its 1 KiB chunks; bench/NOTES.md) and
releases the GIL on large inputs like hashlib, so the same threads hash in parallel. New captures use
it; a manifest that names no algorithm was written before it and is SHA-256, which stays readable.
The manifest's own digest (what the operator records to trust an artifact) stays SHA-256: it is one
small file and its `sha256:` form is part of the API.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import blake3

SHA256 = "sha256"
BLAKE3 = "blake3"
#: every algorithm a manifest may name
ALGORITHMS: tuple[str, ...] = (SHA256, BLAKE3)
#: what a capture uses unless told otherwise (CaptureOptions.digest)
DEFAULT = BLAKE3
#: what a manifest that names none used (every artifact written before the algorithm was recorded)
LEGACY = SHA256
_READ = 4 << 20


class Hasher(Protocol):
    def update(self, data: bytes | bytearray | memoryview, /) -> object: ...

    def hexdigest(self) -> str: ...


def check(algorithm: str, *, field: str = "digest") -> str:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"{field} {algorithm!r} is not one of {', '.join(ALGORITHMS)}")
    return algorithm


def new(algorithm: str) -> Hasher:
    if algorithm == BLAKE3:
        return blake3.blake3()
    if algorithm == SHA256:
        return hashlib.sha256()
    raise ValueError(f"digest algorithm {algorithm!r} is not one of {', '.join(ALGORITHMS)}")


def of_range(algorithm: str, path: Path, offset: int, length: int) -> str:
    """The digest of `length` bytes of `path` from `offset`; OSError if the file ends before."""
    h = new(algorithm)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        done = 0
        while done < length:
            data = os.pread(fd, min(_READ, length - done), offset + done)
            if not data:
                raise OSError(f"{path}: ended at byte {offset + done}, {length - done} bytes short of the range hashed")
            h.update(data)
            done += len(data)
    finally:
        os.close(fd)
    return h.hexdigest()


def chunked_root(algorithm: str, chunks: Sequence[str]) -> str:
    """The digest of a file hashed in chunks: the digest of its chunks' raw digests, in order."""
    h = new(algorithm)
    h.update(b"".join(bytes.fromhex(c) for c in chunks))
    return h.hexdigest()
