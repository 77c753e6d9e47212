"""Artifact staging, atomic publish and verification, on plain files (no CRIU needed)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import time
import tracemalloc
from pathlib import Path

import blake3
import pytest

from podsnap.engine import ArtifactError, Manifest, ProcInfo, read_manifest, verify
from podsnap.engine import _artifact as art
from podsnap.engine._host import HostFacts
from podsnap.engine._manifest import CHUNK_BYTES


def _host() -> HostFacts:
    return HostFacts("h", "x86_64", "6.1.0", "glibc 2.36", 1 << 34, 1 << 33)


def _make(dest: Path, files: dict[str, bytes], digest: str = "blake3") -> Path:
    staging = art.Staging(dest)
    for rel, data in files.items():
        (staging.path / rel).parent.mkdir(parents=True, exist_ok=True)
        (staging.path / rel).write_bytes(data)
    entries = art.describe_files(staging.path, workers=4, algorithm=digest)
    manifest = Manifest(
        digest=digest,
        source=_host(),
        processes=(ProcInfo(pid=42, ns_pid=42, ppid=1, comm="w", cmdline=("w",)),),
        cuda_pids=(),
        cuda_gpu_uuids=(),
        files=entries,
    )
    staging.write_manifest(manifest)
    return staging.publish()


def test_publish_is_atomic_and_leaves_no_staging(tmp_path: Path) -> None:
    out = _make(tmp_path / "a", {"criu/pages-1.img": b"x" * 1000, "criu/core-1.img": b"c"})
    assert out == tmp_path / "a"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]
    m = read_manifest(out)
    assert verify(out, m) == 1001
    assert m.memory_bytes == 1000


def test_existing_destination_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    with pytest.raises(ArtifactError, match="already exists"):
        art.Staging(tmp_path / "a")


def test_discard_removes_the_staging_dir(tmp_path: Path) -> None:
    staging = art.Staging(tmp_path / "a")
    (staging.criu_dir / "x.img").write_bytes(b"1")
    staging.discard()
    assert list(tmp_path.iterdir()) == []


HASHES = {"blake3": blake3.blake3, "sha256": hashlib.sha256}


# sha256: every artifact captured before BLAKE3 (no digestAlgorithm in its manifest) still verifies
@pytest.mark.parametrize("digest", ["blake3", "sha256"])
def test_large_files_are_hashed_in_chunks_and_a_bad_chunk_is_located(tmp_path: Path, digest: str) -> None:
    size = CHUNK_BYTES * 2 + 123
    blob = bytearray(size)
    blob[::4096] = b"\x01" * len(blob[::4096])
    out = _make(tmp_path / "a", {"criu/pages-1.img": bytes(blob)}, digest)
    m = read_manifest(out)
    assert m.digest == digest
    (entry,) = m.files
    assert len(entry.chunks) == 3
    new = HASHES[digest]
    chunks = [new(blob[i : i + CHUNK_BYTES]).hexdigest() for i in range(0, size, CHUNK_BYTES)]
    assert list(entry.chunks) == chunks
    assert entry.digest == new(b"".join(bytes.fromhex(c) for c in chunks)).hexdigest()
    with (out / "criu/pages-1.img").open("r+b") as f:
        f.seek(CHUNK_BYTES + 5)
        f.write(b"\xff")
    with pytest.raises(ArtifactError, match=f"{digest} .*first bad chunk at byte {CHUNK_BYTES}"):
        verify(out, m)


@pytest.mark.parametrize("digest", ["blake3", "sha256"])
def test_small_files_carry_a_plain_digest(tmp_path: Path, digest: str) -> None:
    out = _make(tmp_path / "a", {"criu/core-1.img": b"hello"}, digest)
    (entry,) = read_manifest(out).files
    assert entry.digest == HASHES[digest](b"hello").hexdigest()
    assert entry.chunks == ()


def test_a_manifest_claiming_the_other_algorithm_fails_verification(tmp_path: Path) -> None:
    # what an older podsnap would have done had the algorithm not been recorded: compared the wrong hash
    out = _make(tmp_path / "a", {"criu/core-1.img": b"hello"}, "blake3")
    data = json.loads((out / "manifest.json").read_text())
    data.pop("digestAlgorithm")
    data["schemaVersion"] = 1
    for f in data["files"]:
        f["sha256"] = f.pop("blake3")
    (out / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match=r"sha256 .* differs from the manifest's"):
        verify(out, read_manifest(out))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda a: (a / "criu/core-1.img").write_bytes(b"C"), "tampered or corrupted"),
        (lambda a: (a / "criu/core-1.img").write_bytes(b""), "truncated"),
        (lambda a: (a / "criu/core-1.img").unlink(), "missing"),
        (lambda a: (a / "criu/pstree.img").write_bytes(b"evil"), "not listed"),
    ],
)
def test_verify_refuses_a_changed_artifact_naming_the_file(tmp_path: Path, mutate: object, message: str) -> None:
    out = _make(tmp_path / "a", {"criu/core-1.img": b"c", "criu/pages-1.img": b"p"})
    m = read_manifest(out)
    mutate(out)  # type: ignore[operator]
    with pytest.raises(ArtifactError, match=message) as err:
        verify(out, m)
    assert err.value.path is not None and "criu/" in err.value.path


def test_runtime_files_crui_writes_on_restore_are_tolerated(tmp_path: Path) -> None:
    out = _make(tmp_path / "a", {"criu/core-1.img": b"c"})
    (out / "criu/stats-restore").write_bytes(b"s")
    assert verify(out, read_manifest(out)) == 1


def test_manifest_paths_may_not_escape(tmp_path: Path) -> None:
    out = _make(tmp_path / "a", {"criu/core-1.img": b"c"})
    data = json.loads((out / "manifest.json").read_text())
    data["files"][0]["path"] = "../../etc/passwd"
    (out / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match="escapes the artifact"):
        read_manifest(out)


def test_missing_directory_and_manifest_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="no such artifact"):
        read_manifest(tmp_path / "nope")
    (tmp_path / "half").mkdir()
    with pytest.raises(ArtifactError, match="not a complete artifact"):
        read_manifest(tmp_path / "half")


def test_remove_deletes_the_artifact(tmp_path: Path) -> None:
    out = _make(tmp_path / "a", {"criu/core-1.img": b"c"})
    art.remove(out)
    assert list(tmp_path.iterdir()) == []


def test_a_listed_file_replaced_by_a_symlink_is_refused_even_with_the_same_bytes(tmp_path: Path) -> None:
    out = _make(tmp_path / "a", {"criu/core-1.img": b"c", "criu/pages-1.img": b"p"})
    m = read_manifest(out)
    (tmp_path / "elsewhere").write_bytes(b"c")
    (out / "criu/core-1.img").unlink()
    (out / "criu/core-1.img").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ArtifactError, match="a symlink; an artifact holds only regular files"):
        verify(out, m)


def test_a_symlinked_directory_or_manifest_is_refused(tmp_path: Path) -> None:
    out = _make(tmp_path / "a", {"criu/core-1.img": b"c"})
    m = read_manifest(out)
    (out / "criu").rename(tmp_path / "real-criu")
    (out / "criu").symlink_to(tmp_path / "real-criu")
    with pytest.raises(ArtifactError, match="criu: a symlink"):
        verify(out, m)
    other = _make(tmp_path / "b", {"criu/core-1.img": b"c"})
    (other / "manifest.json").rename(tmp_path / "m.json")
    (other / "manifest.json").symlink_to(tmp_path / "m.json")
    with pytest.raises(ArtifactError, match="a symlink"):
        read_manifest(other)


def test_an_unlisted_symlink_in_the_images_dir_is_refused(tmp_path: Path) -> None:
    out = _make(tmp_path / "a", {"criu/core-1.img": b"c"})
    (out / "criu/pstree.img").symlink_to("/etc/hostname")
    with pytest.raises(ArtifactError, match="not listed"):
        verify(out, read_manifest(out))


def test_the_recorded_digest_is_compared_before_parsing(tmp_path: Path) -> None:
    out = _make(tmp_path / "a", {"criu/core-1.img": b"c"})
    digest = art.manifest_digest(out)
    assert digest == "sha256:" + hashlib.sha256((out / "manifest.json").read_bytes()).hexdigest()
    assert read_manifest(out, expected_digest=digest).processes[0].pid == 42
    (out / "manifest.json").write_text("not even json")
    with pytest.raises(ArtifactError, match="is not the recorded"):
        read_manifest(out, expected_digest=digest)
    with pytest.raises(ValueError, match="not a sha256 digest"):
        read_manifest(out, expected_digest="sha256:abc")


def test_deferred_files_get_only_their_size_and_type_checked(tmp_path: Path) -> None:
    out = _make(tmp_path / "a", {"criu/core-1.img": b"c", "bulk/pages-1.raw": b"r" * 4096})
    m = read_manifest(out)
    (out / "bulk/pages-1.raw").write_bytes(b"R" * 4096)  # same size, other bytes: the fill's digests catch it
    assert verify(out, m, deferred=["bulk/pages-1.raw"]) == 1
    with pytest.raises(ArtifactError, match="tampered or corrupted"):
        verify(out, m)
    (out / "bulk/pages-1.raw").write_bytes(b"R")
    with pytest.raises(ArtifactError, match="truncated"):
        verify(out, m, deferred=["bulk/pages-1.raw"])
    (out / "bulk/pages-1.raw").write_bytes(b"R" * 4096)
    (out / "bulk/extra.raw").write_bytes(b"x")
    with pytest.raises(ArtifactError, match="not listed"):
        verify(out, m, deferred=["bulk/pages-1.raw"])


def test_a_sparse_8_gib_manifest_is_refused_by_its_size_without_reading_it(tmp_path: Path) -> None:
    """Security finding 6: manifest.json is read by every restore, prefetch and periodic check, on every node,
    before its digest can be compared; a planted sparse multi-GB one must cost a reader nothing."""
    out = _make(tmp_path / "a", {"criu/core-1.img": b"c"})
    digest = art.manifest_digest(out)
    os.truncate(out / "manifest.json", 8 << 30)
    cap = f"8589934592 bytes, more than the {art.MANIFEST_MAX_BYTES} bytes a manifest may have (MANIFEST_MAX_BYTES)"
    assert art.MANIFEST_MAX_BYTES == 16 << 20
    for call in (lambda: read_manifest(out, expected_digest=digest), lambda: read_manifest(out),
                 lambda: art.manifest_digest(out)):  # fmt: skip
        tracemalloc.start()
        t0 = time.monotonic()
        try:
            with pytest.raises(ArtifactError, match=re.escape(cap)) as err:
                call()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert time.monotonic() - t0 < 1.0, "refused at once"
        assert peak < 1 << 20, f"nothing of it read into memory (peak {peak} bytes)"
        assert err.value.path == str(out / "manifest.json") and str(out / "manifest.json") in str(err.value)


def test_a_manifest_at_the_cap_is_read_and_one_past_it_is_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = _make(tmp_path / "a", {"criu/core-1.img": b"c"})
    size = (out / "manifest.json").stat().st_size
    monkeypatch.setattr(art, "MANIFEST_MAX_BYTES", size)
    assert read_manifest(out).processes[0].pid == 42
    monkeypatch.setattr(art, "MANIFEST_MAX_BYTES", size - 1)
    with pytest.raises(ArtifactError, match=rf"{size} bytes, more than the {size - 1} bytes"):
        read_manifest(out)


def test_a_manifest_that_is_a_fifo_or_a_directory_is_refused_without_blocking(tmp_path: Path) -> None:
    out = _make(tmp_path / "a", {"criu/core-1.img": b"c"})
    (out / "manifest.json").unlink()
    os.mkfifo(out / "manifest.json")  # an open for reading would wait for a writer
    with pytest.raises(ArtifactError, match="not a regular file"):
        read_manifest(out)
    (out / "manifest.json").unlink()
    (out / "manifest.json").mkdir()
    with pytest.raises(ArtifactError, match="not a regular file"):
        read_manifest(out)


def test_a_capture_never_publishes_a_manifest_no_reader_would_take(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(art, "MANIFEST_MAX_BYTES", 100)
    with pytest.raises(ArtifactError, match=r"more than the 100 a manifest may have .*larger bulk_min_run_bytes"):
        _make(tmp_path / "a", {"criu/core-1.img": b"c"})
    assert not (tmp_path / "a").exists()


def test_verify_copies_the_images_it_hashes_and_checks_the_copy(tmp_path: Path) -> None:
    """`copy_to`: the images are read from the artifact once; the copy holds exactly the bytes hashed."""
    size = CHUNK_BYTES + 5  # one file of two chunks: copied by two threads, each hashing what it writes
    big = os.urandom(size)
    out = _make(tmp_path / "a", {"criu/core-1.img": b"c", "criu/pages-1.img": big, "logs/dump.log": b"l"})
    (out / "criu/stats-restore").write_bytes(b"s")  # what CRIU may leave in an images dir: not copied
    m = read_manifest(out)
    copy = tmp_path / "copy"
    copy.mkdir(mode=0o700)
    assert verify(out, m, workers=2, copy_to=copy) == size + 2
    assert sorted(p.name for p in copy.iterdir()) == ["core-1.img", "pages-1.img"]
    assert (copy / "pages-1.img").read_bytes() == big and (copy / "core-1.img").read_bytes() == b"c"
    assert stat.S_IMODE((copy / "core-1.img").stat().st_mode) == 0o600
    # a forged image is refused on the way, naming the artifact's file
    other = tmp_path / "copy2"
    other.mkdir()
    (out / "criu/core-1.img").write_bytes(b"C")
    with pytest.raises(ArtifactError, match=r"core-1\.img: blake3 .* differs") as err:
        verify(out, m, copy_to=other)
    assert err.value.path == str(out / "criu/core-1.img")
    with pytest.raises(ValueError, match="copy_to"):
        verify(out, m, copy_to=other, digests=False)


def test_files_are_opened_without_following_a_symlink_and_read_no_further_than_they_are(tmp_path: Path) -> None:
    """What verify checked with lstat may be swapped for a symlink before it is opened: the open refuses it;
    a file that ends before the size checked (a volume answering differently) is refused as well."""
    out = _make(tmp_path / "a", {"criu/core-1.img": b"core"})
    (out / "criu").rename(tmp_path / "real")
    (out / "criu").symlink_to(tmp_path / "real")
    with pytest.raises(ArtifactError, match="criu: a symlink"):
        art._open_beneath(out, "criu/core-1.img")
    (out / "criu").unlink()
    (tmp_path / "real").rename(out / "criu")
    (out / "criu/core-1.img").rename(out / "criu/real.img")
    (out / "criu/core-1.img").symlink_to("real.img")
    with pytest.raises(ArtifactError, match=r"core-1\.img: a symlink"):
        art._open_beneath(out, "criu/core-1.img")
    (out / "criu/core-1.img").unlink()
    (out / "criu/real.img").rename(out / "criu/core-1.img")
    with pytest.raises(ArtifactError, match="ended at byte 4, 6 bytes short"):
        art._digests(out, {"criu/core-1.img": 10}, 1, None, "blake3")
