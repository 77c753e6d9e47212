"""The fast restore on real processes and real CRIU: bulk memory cut out of CRIU's images at capture and
written back into the stopped tree by many threads, each chunk digest-checked, before the tree runs.

The worker holds a region of random bytes in one anonymous mapping (what a CUDA checkpoint leaves in a
worker's host memory); it answers with the sha256 of that region recomputed now, so equal answers before
and after mean a bit-exact restore.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from podsnap.engine import (
    ArtifactError,
    CaptureError,
    CaptureOptions,
    Criu,
    CriuBinary,
    Progress,
    RestoreOptions,
    capture,
    read_manifest,
    restore,
    verify,
)
from podsnap.engine import _proctree as proctree
from podsnap.engine._manifest import CHUNK_BYTES
from tests.support.processes import Worker, http_get

pytestmark = pytest.mark.slow

#: the manifest keys schema 1 has always had (podsnap before the fast restore wrote exactly these)
V1_KEYS = {
    "schema",
    "schemaVersion",
    "podsnapVersion",
    "createdAt",
    "source",
    "process",
    "criu",
    "chunkBytes",
    "files",
    "totals",
    "timingsMs",
    "extra",
}


@pytest.fixture
def big(tmp_path: Path) -> Iterator[Worker]:
    w = Worker(tmp_path / "big", bulk_mib=320)
    yield w
    w.kill()


def _gone(worker: Worker) -> None:
    assert proctree.wait_gone(worker.pid, timeout_s=10), "no restored process may be left behind"
    with pytest.raises(OSError):
        http_get(worker.port, timeout=1)


# sha256: the layout of every artifact before BLAKE3 (schema 2), which an older agent restores too
@pytest.mark.parametrize(
    ("bulk_mib", "digest", "schema"),
    [(16, "blake3", 3), (320, "blake3", 3), (320, "sha256", 2)],
    ids=["one-chunk-file", "multi-chunk-file", "multi-chunk-file-sha256"],
)
def test_a_large_anonymous_region_comes_back_bit_exact_through_the_parallel_fill(
    criu: Criu, tmp_path: Path, bulk_mib: int, digest: str, schema: int
) -> None:
    worker = Worker(tmp_path / "w", bulk_mib=bulk_mib)
    try:
        before = worker.get()
        cap = capture(worker.pid, tmp_path / "art", CaptureOptions(digest=digest), criu=criu)
        m = cap.manifest
        assert m.schema_version == schema and m.digest == digest and m.bulk, "the region left CRIU's images"
        # all of it, but for at most one CRIU entry (<= 1 MiB) at an edge shared with another kind of mapping
        assert m.bulk_bytes >= (bulk_mib - 2) << 20
        assert cap.phase_bytes["cut"] == m.bulk_bytes
        # the raw file's digests were taken while CRIU wrote it: the hash phase read only the rest
        assert cap.phase_bytes["hash"] <= m.total_bytes - m.bulk_bytes
        assert sum(f.size for f in m.files if f.path.startswith("criu/pages-")) < 64 << 20, "CRIU keeps the rest"
        assert json.loads((tmp_path / "art" / "manifest.json").read_text())["schemaVersion"] == schema

        restored = restore(
            tmp_path / "art", RestoreOptions(expected_manifest_digest=cap.manifest_digest, fill_workers=4), criu=criu
        )
        assert restored.pid == worker.pid
        assert {"criu_restore", "fill", "resume"} <= set(restored.timings_ms)
        assert restored.phase_bytes["fill"] == m.bulk_bytes
        assert restored.phase_bytes["verify"] < m.total_bytes - m.bulk_bytes + (1 << 20), "bulk files skip verify"
        after = worker.get()
        assert after["bulk"] == before["bulk"], "the region is bit-exact"
        assert after["init_id"] == before["init_id"] and after["requests"] == before["requests"] + 1
    finally:
        worker.kill()


def _flip(path: Path, offset: int) -> None:
    with path.open("r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_a_tampered_chunk_is_refused_naming_the_chunk_and_nothing_is_left_running(
    criu: Criu, big: Worker, tmp_path: Path
) -> None:
    cap = capture(big.pid, tmp_path / "art", criu=criu)
    extent = max(cap.manifest.bulk, key=lambda e: e.length)  # the region (smaller runs are the heap's)
    raw = tmp_path / "art" / extent.file
    assert extent.offset < 2 * CHUNK_BYTES < extent.offset + extent.length, "chunk 2 holds region bytes"
    _flip(raw, 2 * CHUNK_BYTES + 12345)
    with pytest.raises(ArtifactError, match=rf"chunk 2 \(bytes {2 * CHUNK_BYTES}\.\.{3 * CHUNK_BYTES}\)") as err:
        restore(tmp_path / "art", criu=criu)
    assert err.value.path == str(raw)
    _gone(big)
    with pytest.raises(ArtifactError, match=f"first bad chunk at byte {2 * CHUNK_BYTES}"):
        verify(tmp_path / "art", read_manifest(tmp_path / "art"))


def test_a_failure_in_the_middle_of_the_fill_leaves_no_process_behind(criu: Criu, big: Worker, tmp_path: Path) -> None:
    capture(big.pid, tmp_path / "art", criu=criu)
    seen: list[Progress] = []

    class Interrupted(Exception):
        pass

    def progress(p: Progress) -> None:
        # the seam: a caller's progress callback that raises mid-fill aborts the restore like any failure
        if p.phase == "fill" and p.done > 0 and not p.finished:
            seen.append(p)
            if len(seen) == 2:
                raise Interrupted

    with pytest.raises(Interrupted):
        restore(tmp_path / "art", RestoreOptions(fill_workers=2), criu=criu, progress=progress)
    assert 0 < seen[-1].done < seen[-1].total, "it failed in the middle"
    _gone(big)
    # the artifact itself is fine: a second restore succeeds
    restore(tmp_path / "art", criu=criu)
    assert "bulk" in big.get()


def test_without_the_fast_path_capture_writes_the_v1_layout_which_restores_through_criu_alone(
    criu: Criu, big: Worker, tmp_path: Path
) -> None:
    before = big.get()
    cap = capture(big.pid, tmp_path / "art", CaptureOptions(fast_restore=False, digest="sha256"), criu=criu)
    data = json.loads((tmp_path / "art" / "manifest.json").read_text())
    assert data["schemaVersion"] == 1 and set(data) == V1_KEYS
    assert not (tmp_path / "art" / "bulk").exists() and cap.manifest.bulk == ()
    restored = restore(tmp_path / "art", criu=criu)
    assert "fill" not in restored.timings_ms
    assert big.get()["bulk"] == before["bulk"]


def test_the_recorded_manifest_digest_is_checked_before_the_manifest_is_parsed(
    criu: Criu, worker: Worker, tmp_path: Path
) -> None:
    cap = capture(worker.pid, tmp_path / "art", criu=criu)
    shutil.copytree(tmp_path / "art", tmp_path / "other")
    manifest = tmp_path / "other" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"nsPid"', '"nsPid" ', 1))  # same meaning, other bytes
    with pytest.raises(ArtifactError, match="is not the recorded"):
        restore(tmp_path / "other", RestoreOptions(expected_manifest_digest=cap.manifest_digest), criu=criu)
    manifest.write_text("{not json")
    with pytest.raises(ArtifactError, match="is not the recorded"):
        restore(tmp_path / "other", RestoreOptions(expected_manifest_digest=cap.manifest_digest), criu=criu)
    with pytest.raises(ValueError, match="expected_manifest_digest"):
        RestoreOptions(expected_manifest_digest="md5:1234")
    restore(tmp_path / "art", RestoreOptions(expected_manifest_digest=cap.manifest_digest.upper()[7:]), criu=criu)
    assert worker.get()["init_id"] == worker.init_id


def test_a_newer_schema_is_refused_saying_why(criu: Criu, big: Worker, tmp_path: Path) -> None:
    capture(big.pid, tmp_path / "art", CaptureOptions(digest="sha256"), criu=criu)
    path = tmp_path / "art" / "manifest.json"
    data = json.loads(path.read_text())
    data["schemaVersion"] = 4
    path.write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match=r"schemaVersion 4 is newer than this podsnap understands \(3\)"):
        restore(tmp_path / "art", criu=criu)
    data["schemaVersion"] = 1  # an older podsnap's layout cannot carry bulk extents: refused, not half-restored
    path.write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match="'bulk' section needs schemaVersion 2"):
        restore(tmp_path / "art", criu=criu)
    assert not proctree.is_alive(big.pid)


def test_images_the_cut_cannot_read_fail_the_capture_saying_how_to_go_on(
    criu: Criu, big: Worker, tmp_path: Path
) -> None:
    """A CRIU whose pagemap this podsnap cannot parse (a future format, a truncated write)."""
    script = tmp_path / "criu-odd-pagemap"
    script.write_text(
        "#!/bin/sh\n"
        f'LD_LIBRARY_PATH={criu.binary.lib_dir or ""} {criu.binary.exe} "$@" || exit $?\n'
        'if [ "$1" = dump ]; then while [ $# -gt 0 ]; do [ "$1" = -D ] && D=$2; shift; done\n'
        '  for f in "$D"/pagemap-*.img; do truncate -s -1 "$f"; done; fi\n'
    )
    script.chmod(0o755)
    with pytest.raises(CaptureError, match=r"cannot split .*truncated.*capture with fast_restore=False") as err:
        capture(big.pid, tmp_path / "art", criu=Criu(CriuBinary(script)))
    assert err.value.phase == "cut"
    assert not (tmp_path / "art").exists()


THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _thp_mode() -> str:
    try:
        return THP_MODE.read_text().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return "absent"


def _thp_fault_fallbacks() -> int:
    """The kernel's count of huge-page faults that got small pages instead (no free 2 MiB page in reach)."""
    for line in Path("/proc/vmstat").read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == "thp_fault_fallback":
            return int(value)
    return 0


def _mapping_of(pid: int, vaddr: int) -> dict[str, Any]:
    """The /proc/PID/smaps entry holding `vaddr`: its VmFlags and AnonHugePages bytes."""
    found: dict[str, Any] | None = None
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head, _, rest = line.partition(" ")
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            if found is not None:
                break
            if lo <= vaddr < hi:
                found = {"size": hi - lo}
        elif found is not None and head == "AnonHugePages:":
            found["huge"] = int(rest.split()[0]) << 10
        elif found is not None and head == "VmFlags:":
            found["flags"] = rest.split()
    assert found is not None, f"no mapping of pid {pid} holds {vaddr:#x}"
    return found


@pytest.mark.skipif(_thp_mode() not in {"madvise", "always"}, reason="transparent huge pages are off on this host")
def test_the_bulk_mapping_comes_back_advised_and_backed_by_huge_pages(criu: Criu, big: Worker, tmp_path: Path) -> None:
    before = big.get()
    cap = capture(big.pid, tmp_path / "art", criu=criu)
    region = max(cap.manifest.bulk, key=lambda e: e.length)
    assert cap.phase_bytes["hugepages"] >= region.length
    fallbacks_before = _thp_fault_fallbacks()
    restored = restore(tmp_path / "art", RestoreOptions(fill_workers=2), criu=criu)
    fallbacks = _thp_fault_fallbacks() - fallbacks_before
    assert big.get()["bulk"] == before["bulk"]
    # (the run may begin in the mapping below: CRIU's entries do not stop at mapping boundaries)
    mapping = _mapping_of(restored.pid, region.vaddr + region.length // 2)
    assert "hg" in mapping["flags"], "CRIU replayed the MADV_HUGEPAGE the cut added"
    # The fill faulted 2 MiB pages: all of the 320 MiB region but its unaligned edges, less each fault the
    # kernel itself served with small pages because no free huge page was in reach (a busy or fragmented
    # host: CI once got 276 of 316 MiB). The count is machine-wide, so it can only excuse too much, never
    # too little; a fill that faulted 4 KiB pages on its own would leave huge at 0 with no fallbacks.
    assert mapping["huge"] + fallbacks * (2 << 20) >= (320 - 4) << 20, (mapping["huge"], fallbacks)


@pytest.mark.skipif(_thp_mode() != "madvise", reason="only THP 'madvise' shows the advice's effect alone")
def test_without_the_advice_the_bulk_mapping_keeps_small_pages(criu: Criu, big: Worker, tmp_path: Path) -> None:
    cap = capture(big.pid, tmp_path / "art", CaptureOptions(bulk_hugepages=False), criu=criu)
    assert "hugepages" not in cap.phase_bytes
    region = max(cap.manifest.bulk, key=lambda e: e.length)
    restored = restore(tmp_path / "art", criu=criu)
    mapping = _mapping_of(restored.pid, region.vaddr + region.length // 2)
    assert "hg" not in mapping["flags"] and mapping.get("huge", 0) == 0


def test_verified_digests_hash_nothing_but_still_check_sizes_and_the_manifest(
    criu: Criu, big: Worker, tmp_path: Path
) -> None:
    """The node-local cache's path: the caller vouches for the digests, so nothing is hashed again."""
    before = big.get()
    cap = capture(big.pid, tmp_path / "art", criu=criu)
    with pytest.raises(ValueError, match="verified_digests needs expected_manifest_digest"):
        RestoreOptions(verified_digests=True)
    trusted = RestoreOptions(expected_manifest_digest=cap.manifest_digest, verified_digests=True)
    restored = restore(tmp_path / "art", trusted, criu=criu)
    assert "verify" not in restored.phase_bytes, "no file was hashed before CRIU ran"
    assert restored.phase_bytes["fill"] == cap.manifest.bulk_bytes
    assert big.get()["bulk"] == before["bulk"]
    big.kill()

    # what the trust means: a changed byte is not noticed (the cache's own check must have caught it)
    extent = max(cap.manifest.bulk, key=lambda e: e.length)
    _flip(tmp_path / "art" / extent.file, extent.offset + extent.length // 2)  # inside the region itself
    restore(tmp_path / "art", trusted, criu=criu)
    assert big.get()["bulk"] != before["bulk"]
    big.kill()
    with pytest.raises(ArtifactError, match="tampered or corrupted"):
        restore(tmp_path / "art", RestoreOptions(expected_manifest_digest=cap.manifest_digest), criu=criu)
    _gone(big)

    # sizes, unlisted files and the manifest's digest are still checked
    with (tmp_path / "art" / extent.file).open("r+b") as f:
        f.truncate(extent.offset + extent.length - 4096)
    with pytest.raises(ArtifactError, match="differs from the manifest"):
        restore(tmp_path / "art", trusted, criu=criu)
    other = RestoreOptions(expected_manifest_digest="sha256:" + "0" * 64, verified_digests=True)
    with pytest.raises(ArtifactError, match="is not the recorded"):
        restore(tmp_path / "art", other, criu=criu)
    assert not proctree.is_alive(big.pid)
