"""Digests of CRIU's pages images taken while CRIU is still writing them.

CRIU's dump writes each process's pages image front to back with one thread (≈1.4 GiB/s on the H200)
and never goes back; the capture used to hash the images afterwards (≈0.8 s for 10 GB on 16 threads).
A `Prehash` watches the images dir during the dump and hashes every CHUNK_BYTES chunk of a
`pages-N.img` as soon as the file has grown past it, on other cores, so by the end of the dump only the
last partial chunk of each file is left. The digests are the manifest's own (`_artifact`: a file's
chunks' digests, and over them its root, by the same algorithm), so `describe_files` takes them as
they are, for the files that have not changed since (the cut renames a pages image into bulk/ without
touching a byte).
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from podsnap.engine import _digest
from podsnap.engine._manifest import CHUNK_BYTES

_PAGES = re.compile(r"pages-[0-9]+\.img")
_POLL_S = 0.02


class Prehash:
    """Hash the pages images in `directory` while a writer appends to them; `finish()` once it is done."""

    def __init__(self, directory: Path, *, workers: int, algorithm: str = _digest.DEFAULT) -> None:
        self.directory = directory
        self.algorithm = algorithm
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="podsnap-prehash")
        #: file name -> chunk index -> its digest (a future until hashed)
        self._chunks: dict[str, dict[int, Future[str]]] = {}
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="podsnap-prehash-watch", daemon=True)

    def __enter__(self) -> Prehash:
        self._watcher.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._watcher.join()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _scan(self, *, final: bool) -> None:
        """Submit every chunk that is complete now (with `final`: the last partial chunk too)."""
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.directory):
                if not _PAGES.fullmatch(entry.name):
                    continue
                size = entry.stat(follow_symlinks=False).st_size
                known = self._chunks.setdefault(entry.name, {})
                complete = size // CHUNK_BYTES
                last = -(-size // CHUNK_BYTES) if final else complete
                for index in range(len(known), last):
                    length = min(CHUNK_BYTES, size - index * CHUNK_BYTES)
                    known[index] = self._pool.submit(
                        _digest.of_range, self.algorithm, Path(entry.path), index * CHUNK_BYTES, length
                    )

    def _watch(self) -> None:
        while not self._stop.wait(_POLL_S):
            self._scan(final=False)

    def finish(self) -> dict[str, tuple[int, list[str]]]:
        """After the writer finished: hash what is left; file name -> (size hashed, chunk digests)."""
        self._stop.set()
        self._watcher.join()
        self._scan(final=True)
        out: dict[str, tuple[int, list[str]]] = {}
        for name, chunks in self._chunks.items():
            size = (self.directory / name).stat().st_size
            digests = [chunks[i].result() for i in range(len(chunks))]
            if size and len(digests) == -(-size // CHUNK_BYTES):
                out[name] = (size, digests)
        return out
