"""Artifact staging, atomic publish and verification, on plain files (no CRIU needed)."""

from __future__ import annotations

import hashlib
import json
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
