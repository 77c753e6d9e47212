"""The node-local artifact cache on real files: staging and atomic publication, full verification when
filled, the checks at every use (key, manifest digest, seal), LRU eviction of whole artifacts, pins, the
disk floor, restart, and the executor that restores through it. The verifier here is a stand-in for the
engine (a manifest.json listing each file's sha256, checked the same way); the engine's own checks on
real CRIU artifacts are in tests/agent/test_cache_restore.py."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from podsnap.agent.cache import (
    ArtifactCache,
    ArtifactMismatch,
    CacheKey,
    CacheMetrics,
    FillProgress,
    IOGate,
)
from podsnap.agent.cached_executor import CachingExecutor, Filler, worth_waiting
from podsnap.agent.executor import (
    ArtifactUnusable,
    CaptureRequest,
    CaptureResult,
    PodRef,
    RestoreRequest,
    RestoreResult,
)

MiB = 1 << 20


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class ListVerifier:
    """The engine's two checks, on a manifest.json of the form {"files": {path: sha256}}."""

    def __init__(self) -> None:
        self.verified: list[Path] = []

    def _manifest(self, artifact: Path, digest: str) -> dict[str, str]:
        raw = (artifact / "manifest.json").read_bytes()
        if f"sha256:{sha(raw)}" != digest:
            raise ArtifactUnusable(f"{artifact}/manifest.json is not {digest}")
        files: dict[str, str] = json.loads(raw)["files"]
        return files

    def artifact_files(self, artifact: Path, digest: str) -> list[tuple[str, int]]:
        files = self._manifest(artifact, digest)
        own = (artifact / "manifest.json").stat().st_size
        return [("manifest.json", own), *((p, (artifact / p).stat().st_size) for p in files)]

    def verify_artifact(self, artifact: Path, digest: str) -> int:
        self.verified.append(artifact)
        total = 0
        for rel, want in self._manifest(artifact, digest).items():
            data = (artifact / rel).read_bytes()
            if sha(data) != want:
                raise ArtifactUnusable(f"{artifact / rel}: sha256 differs from the manifest's")
            total += len(data)
        return total


def make_artifact(root: Path, name: str, sizes: dict[str, int], seed: int = 0) -> tuple[Path, str]:
    """An artifact dir with files of `sizes` (random bytes) and its manifest; (dir, manifest digest)."""
    art = root / name
    listed = {}
    for rel, size in sizes.items():
        (art / rel).parent.mkdir(parents=True, exist_ok=True)
        data = os.urandom(size) if size else b""
        (art / rel).write_bytes(data)
        listed[rel] = sha(data)
    raw = json.dumps({"files": listed, "seed": seed}).encode()
    (art / "manifest.json").write_bytes(raw)
    return art, f"sha256:{sha(raw)}"


def key(name: str, digest: str) -> CacheKey:
    return CacheKey(f"podsnapshotcontent-{name}", digest)


@pytest.fixture
def verifier() -> ListVerifier:
    return ListVerifier()


def new_cache(tmp_path: Path, verifier: ListVerifier, max_bytes: int = 64 * MiB, **kw: object) -> ArtifactCache:
    return ArtifactCache(
        tmp_path / "cache",
        verifier,
        max_bytes=max_bytes,
        min_free_percent=0,
        metrics=CacheMetrics(CollectorRegistry()),
        **kw,  # type: ignore[arg-type]
    ).open()


def test_a_fill_copies_the_listed_files_verifies_them_and_publishes_whole(
    tmp_path: Path, verifier: ListVerifier
) -> None:
    art, digest = make_artifact(tmp_path / "volume", "a", {"criu/pages-1.img": 3 * MiB, "criu/core.img": 100})
    (art / "criu" / "unlisted.img").write_bytes(b"not in the manifest")
    cache = new_cache(tmp_path, verifier)
    k = key("a", digest)
    assert cache.fill(k, art)
    entry = tmp_path / "cache" / "entries" / k.dirname
    assert sorted(
        p.relative_to(entry / "artifact").as_posix() for p in (entry / "artifact").rglob("*") if p.is_file()
    ) == [
        "criu/core.img",
        "criu/pages-1.img",
        "manifest.json",
    ]
    assert (entry / "artifact" / "criu" / "pages-1.img").read_bytes() == (art / "criu" / "pages-1.img").read_bytes()
    assert verifier.verified and verifier.verified[-1].parent.parent.name == "staging", "verified before publication"
    assert list((tmp_path / "cache" / "staging").iterdir()) == []
    assert (tmp_path / "cache").stat().st_mode & 0o777 == 0o700
    lease = cache.lookup(k)
    assert lease is not None and lease.path == entry / "artifact"
    lease.release()


def test_an_artifact_that_fails_verification_is_never_published(tmp_path: Path, verifier: ListVerifier) -> None:
    art, digest = make_artifact(tmp_path / "volume", "a", {"criu/pages-1.img": MiB})
    data = bytearray((art / "criu" / "pages-1.img").read_bytes())
    data[1000] ^= 1
    (art / "criu" / "pages-1.img").write_bytes(bytes(data))
    cache = new_cache(tmp_path, verifier)
    with pytest.raises(ArtifactMismatch, match="sha256 differs"):
        cache.fill(key("a", digest), art)
    assert list((tmp_path / "cache" / "entries").iterdir()) == []
    assert list((tmp_path / "cache" / "staging").iterdir()) == []
    assert cache.used_bytes == 0
    # a manifest that is not the recorded one is refused before anything is copied
    _, other = make_artifact(tmp_path / "volume", "b", {"x": 10}, seed=1)
    with pytest.raises(ArtifactMismatch, match="is not"):
        cache.fill(key("a", other), art)


def test_a_symlink_on_the_volume_is_not_followed(tmp_path: Path, verifier: ListVerifier) -> None:
    art, digest = make_artifact(tmp_path / "volume", "a", {"criu/pages-1.img": 1000})
    secret = tmp_path / "host-secret"
    secret.write_bytes(b"s" * 1000)
    (art / "criu" / "pages-1.img").unlink()
    (art / "criu" / "pages-1.img").symlink_to(secret)
    cache = new_cache(tmp_path, verifier)
    with pytest.raises(ArtifactMismatch, match="symlink"):
        cache.fill(key("a", digest), art)
    assert list((tmp_path / "cache" / "entries").iterdir()) == []


@pytest.mark.parametrize("tamper", ["content", "manifest", "missing", "swap"])
def test_an_entry_changed_after_its_fill_is_dropped_at_use(tmp_path: Path, verifier: ListVerifier, tamper: str) -> None:
    art, digest = make_artifact(tmp_path / "volume", "a", {"criu/pages-1.img": MiB})
    other, other_digest = make_artifact(tmp_path / "volume", "b", {"criu/pages-1.img": MiB}, seed=2)
    cache = new_cache(tmp_path, verifier)
    k, kb = key("a", digest), key("b", other_digest)
    assert cache.fill(k, art) and cache.fill(kb, other)
    entry = cache.entries[k].artifact
    if tamper == "content":  # same size, same bytes count: only the seal can tell
        with (entry / "criu" / "pages-1.img").open("r+b") as f:
            f.seek(4096)
            b = f.read(1)
            f.seek(4096)
            f.write(bytes([b[0] ^ 0xFF]))
    elif tamper == "manifest":
        (entry / "manifest.json").write_text("{}")
    elif tamper == "missing":
        (entry / "criu" / "pages-1.img").unlink()
    else:  # another content's entry put in its place
        cache.entries[kb].artifact.rename(tmp_path / "b-artifact")
        entry.rename(cache.entries[kb].artifact)
        (tmp_path / "b-artifact").rename(entry)
    assert cache.lookup(k) is None
    assert not cache.contains(k) and not (tmp_path / "cache" / "entries" / k.dirname).exists()
    assert cache.metrics.evictions.labels("dropped")._value.get() == 1


def test_an_entry_serves_only_the_content_and_digest_it_was_filled_for(tmp_path: Path, verifier: ListVerifier) -> None:
    art, digest = make_artifact(tmp_path / "volume", "a", {"f": 100})
    cache = new_cache(tmp_path, verifier)
    assert cache.fill(key("a", digest), art)
    assert cache.lookup(key("b", digest)) is None, "another content (namespace) with the same bytes"
    _, other = make_artifact(tmp_path / "volume", "c", {"f": 100}, seed=3)
    assert cache.lookup(key("a", other)) is None, "the same content, another recorded digest"
    with pytest.raises(ValueError, match="not a PodSnapshotContent name"):
        CacheKey("../escape", digest)
    with pytest.raises(ValueError, match="not a manifest digest"):
        CacheKey("podsnapshotcontent-a", "md5:00")


def test_least_recently_used_whole_artifacts_are_evicted_never_a_pinned_one(
    tmp_path: Path, verifier: ListVerifier
) -> None:
    clock = iter(range(1000)).__next__
    cache = new_cache(tmp_path, verifier, max_bytes=3 * MiB + 2000, clock=lambda: float(clock()))
    arts = {n: make_artifact(tmp_path / "volume", n, {"f": MiB}, seed=i) for i, n in enumerate("abcd")}
    keys = {n: key(n, d) for n, (_, d) in arts.items()}
    for n in "abc":
        assert cache.fill(keys[n], arts[n][0])
    a = cache.lookup(keys["a"])  # a is now the most recently used, and in use
    assert a is not None
    b = cache.lookup(keys["b"])
    assert b is not None
    b.release()
    assert cache.fill(keys["d"], arts["d"][0])
    assert {e["content"][-1] for e in cache.snapshot()} == {"a", "b", "d"}, "c was the least recently used"
    # everything else pinned or too big: a fill that cannot fit is skipped, nothing is evicted for it
    d = cache.lookup(keys["d"])
    b = cache.lookup(keys["b"])
    assert b is not None and d is not None
    big, big_digest = make_artifact(tmp_path / "volume", "e", {"f": 2 * MiB}, seed=9)
    assert not cache.fill(key("e", big_digest), big)
    assert {e["content"][-1] for e in cache.snapshot()} == {"a", "b", "d"}
    # a pinned entry dropped meanwhile stays readable until its lease ends
    cache.drop(keys["a"], reason="released")
    assert (a.path / "f").exists()
    a.release()
    assert not a.path.exists()
    for lease in (b, d):
        lease.release()
    assert cache.used_bytes == sum(e["bytes"] for e in cache.snapshot())
    with pytest.raises(ValueError):
        ArtifactCache(tmp_path / "x", verifier, max_bytes=0)


def test_the_disk_floor_is_kept(tmp_path: Path, verifier: ListVerifier) -> None:
    st = os.statvfs(tmp_path)
    free_percent = 100 * st.f_bavail / st.f_blocks
    art, digest = make_artifact(tmp_path / "volume", "a", {"f": MiB})
    floor = int(free_percent) + 1  # more than is free now: no fill may happen
    cache = ArtifactCache(tmp_path / "cache", verifier, max_bytes=64 * MiB, min_free_percent=min(floor, 99)).open()
    assert not cache.fill(key("a", digest), art)
    assert cache.metrics.fills.labels("skipped")._value.get() == 1


def test_a_restart_keeps_complete_entries_and_removes_half_done_work(tmp_path: Path, verifier: ListVerifier) -> None:
    art, digest = make_artifact(tmp_path / "volume", "a", {"f": MiB})
    cache = new_cache(tmp_path, verifier)
    k = key("a", digest)
    assert cache.fill(k, art)
    (tmp_path / "cache" / "staging" / "leftover").mkdir()
    (tmp_path / "cache" / "entries" / "podsnapshotcontent-x@").mkdir()  # no entry.json: incomplete
    again = new_cache(tmp_path, verifier)
    assert again.contains(k) and again.used_bytes == cache.used_bytes
    assert list((tmp_path / "cache" / "staging").iterdir()) == []
    assert sorted(p.name for p in (tmp_path / "cache" / "entries").iterdir()) == [k.dirname]
    lease = again.lookup(k)
    assert lease is not None
    lease.release()
    smaller = new_cache(tmp_path, verifier, max_bytes=MiB // 2)  # the limit was lowered: evicted at start
    assert not smaller.contains(k) and smaller.used_bytes == 0


def test_a_stopping_agent_ends_a_fill_and_leaves_nothing(tmp_path: Path, verifier: ListVerifier) -> None:
    art, digest = make_artifact(tmp_path / "volume", "a", {"f": 3 * MiB})
    cache = new_cache(tmp_path, verifier)
    cache.stopping.set()
    assert not cache.fill(key("a", digest), art)
    assert list((tmp_path / "cache" / "staging").iterdir()) == [] and cache.used_bytes == 0


def test_fills_wait_while_a_restore_or_capture_runs(tmp_path: Path, verifier: ListVerifier) -> None:
    art, digest = make_artifact(tmp_path / "volume", "a", {"f": MiB})
    cache = new_cache(tmp_path, verifier)
    gate = IOGate()
    filler = Filler(cache, gate)
    done = threading.Event()
    outcome: list[str] = []
    try:
        with gate.foreground():
            assert filler.submit(key("a", digest), art, on_done=lambda k, o, m: (outcome.append(o), done.set()))
            assert not done.wait(1.0), "the fill ran while foreground work held the gate"
        assert done.wait(30) and outcome == ["filled"]
        assert not filler.submit(key("a", digest), art), "filled already"
    finally:
        filler.stop()


def test_waiting_for_a_fill_only_when_it_ends_before_a_volume_read() -> None:
    k = CacheKey("podsnapshotcontent-a", "sha256:" + "0" * 64)
    started = FillProgress(k, total=10 * 1024 * MiB)
    assert worth_waiting(started, 0.0) is None, "no measured rate yet"
    import time

    half = FillProgress(k, total=10 * 1024 * MiB, copy_started=time.monotonic() - 5.0, copied=5 * 1024 * MiB)
    # copy 1 GiB/s: 5 s left + 10 GiB at 8 GiB/s verify = 6.25 s, against 10 s from the volume
    wait = worth_waiting(half, 8 * 1024 * MiB)
    assert wait is not None and 6.0 < wait < 6.6
    # hashing slower than the volume: waiting never pays
    assert worth_waiting(half, 512 * MiB) is None
    verifying = FillProgress(k, total=MiB, verifying=True)
    assert worth_waiting(verifying, float(MiB)) == pytest.approx(1.0)


@dataclass
class Inner:
    """The executor under the cache: records where each restore read from; refuses on request."""

    restores: list[RestoreRequest] = field(default_factory=list)
    refuse_cache: bool = False
    verifier: ListVerifier = field(default_factory=ListVerifier)

    def capture(self, request: CaptureRequest) -> CaptureResult:
        raise NotImplementedError

    def restore(self, request: RestoreRequest) -> RestoreResult:
        self.restores.append(request)
        if self.refuse_cache and request.verified_digests:
            raise ArtifactUnusable("criu/pages-1.img: changed since it was verified (size or type)")
        return RestoreResult(pids=(1,))

    def remove(self, artifact_dir: Path) -> None:
        raise NotImplementedError

    def check(self, artifact_dir: Path, expected_digest: str) -> None:
        raise NotImplementedError

    def artifact_files(self, artifact: Path, digest: str) -> list[tuple[str, int]]:
        return self.verifier.artifact_files(artifact, digest)

    def verify_artifact(self, artifact: Path, digest: str) -> int:
        return self.verifier.verify_artifact(artifact, digest)


def request(art: Path, digest: str, content: str = "podsnapshotcontent-a") -> RestoreRequest:
    pod = PodRef("ns", "p", "uid", "main", "containerd://" + "a" * 64)
    return RestoreRequest(pod, (1,), 1, art, False, "n", expected_digest=digest, content=content)


def test_restores_read_the_volume_then_the_cache_it_filled(tmp_path: Path) -> None:
    inner = Inner()
    art, digest = make_artifact(tmp_path / "volume", "a", {"f": MiB})
    cache = ArtifactCache(tmp_path / "cache", inner, max_bytes=64 * MiB, min_free_percent=0).open()
    filler = Filler(cache, IOGate())
    ex = CachingExecutor(inner, cache, filler)
    try:
        first = ex.restore(request(art, digest))
        assert first.source == "volume" and inner.restores[-1].artifact_dir == art
        assert not inner.restores[-1].verified_digests
        import time

        deadline = time.monotonic() + 30
        while not cache.contains(key("a", digest)):  # the fill queued after the restore
            assert time.monotonic() < deadline, "the fill after the restore did not happen"
            time.sleep(0.05)
        second = ex.restore(request(art, digest))
        assert second.source == "cache" and inner.restores[-1].verified_digests
        assert inner.restores[-1].artifact_dir == cache.entries[key("a", digest)].artifact
        assert cache.metrics.hits._value.get() == 1 and cache.metrics.misses._value.get() == 1
        # the engine refuses the cached copy: it is dropped, and the same restore reads the volume
        inner.refuse_cache = True
        third = ex.restore(request(art, digest))
        assert third.source == "volume" and inner.restores[-1].artifact_dir == art
        assert [r.verified_digests for r in inner.restores[-2:]] == [True, False]
        # no content name or digest: never through the cache
        ex.restore(request(art, "", content=""))
        assert inner.restores[-1].artifact_dir == art
    finally:
        filler.stop()
