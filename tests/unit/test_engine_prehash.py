"""Digests of pages images taken while a writer still appends to them (what the capture does during
CRIU's dump), against the digests the artifact code computes afterwards."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tests.support.waiting import wait_for

from podsnap.engine import ArtifactError, _manifest
from podsnap.engine import _artifact as art
from podsnap.engine._prehash import Prehash

CHUNK = 1 << 20


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    # 1 MiB chunks instead of 64 MiB: the same code on small files
    monkeypatch.setattr(_manifest, "CHUNK_BYTES", CHUNK)
    monkeypatch.setattr(art, "CHUNK_BYTES", CHUNK)
    monkeypatch.setattr("podsnap.engine._prehash.CHUNK_BYTES", CHUNK)


def test_chunks_are_hashed_as_the_writer_passes_them_and_match_the_manifest_digests(tmp_path: Path) -> None:
    criu = tmp_path / "criu"
    criu.mkdir()
    data = {name: os.urandom(size) for name, size in (("pages-1.img", 5 * CHUNK + 123), ("pages-2.img", CHUNK))}
    (criu / "core-1.img").write_bytes(b"not a pages image")
    with Prehash(criu, workers=2) as pre:
        for name, blob in data.items():
            with (criu / name).open("wb") as f:
                for off in range(0, len(blob), 64 << 10):  # a writer appending, as CRIU's splice does
                    f.write(blob[off : off + (64 << 10)])
                    f.flush()
                    if name == "pages-1.img" and off == 4 * CHUNK:
                        # the chunks the file has grown past are taken up while the writer goes on
                        wait_for(lambda: len(pre._chunks.get("pages-1.img", {})) == 4, timeout=10, interval=0.01)
        found = pre.finish()
    assert set(found) == set(data), "only pages images"
    known = {f"criu/{name}": digests for name, digests in found.items()}
    with_known = art.describe_files(tmp_path, workers=2, known=known)
    assert with_known == art.describe_files(tmp_path, workers=2)
    # a file whose size changed since it was hashed is refused, never hashed again as the volume now holds it
    (criu / "pages-2.img").write_bytes(data["pages-2.img"] + b"x")
    with pytest.raises(ArtifactError, match=r"pages-2\.img: has 1048577 bytes, not the 1048576 it had when hashed"):
        art.describe_files(tmp_path, known=known)
    # one changed in place keeps the digest of what the writer wrote: the artifact fails verification
    (criu / "pages-2.img").write_bytes(b"y" + data["pages-2.img"][1:])
    entry = {f.path: f for f in art.describe_files(tmp_path, known=known)}["criu/pages-2.img"]
    assert entry.digest == known["criu/pages-2.img"][1][0]
    (criu / "pages-2.img").unlink()
    with pytest.raises(ArtifactError, match=r"pages-2\.img: is gone"):
        art.describe_files(tmp_path, known=known)
