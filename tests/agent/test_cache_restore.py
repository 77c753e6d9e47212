"""The node-local artifact cache with the real engine and real CRIU: a worker with a large anonymous region
(the fast restore's bulk files) is captured on the "volume", copied into the cache and verified by the
engine, then restored into other pods through the cache, bit-exactly. A cache entry changed after its
fill is never restored: it is dropped and the restore reads the volume, still bit-exact. An artifact on
the volume that does not match its recorded digest never enters the cache."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from podsnap.agent.cache import ArtifactCache, ArtifactMismatch, CacheKey, CacheMetrics, IOGate
from podsnap.agent.cached_executor import CachingExecutor, Filler
from podsnap.agent.engine_executor import EngineExecutor
from podsnap.engine import _proctree as proctree  # white-box: pid namespace introspection
from tests.agent.requests import capture_request, restore_request
from tests.support.criu import criu_or_skip
from tests.support.processes import Pod, http_get

pytestmark = pytest.mark.slow
CONTENT = "podsnapshotcontent-cache-test"


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[list[Pod]]:
    criu_or_skip()
    made: list[Pod] = []
    try:
        made.extend(Pod(tmp_path / f"pod-{i}", []) for i in range(3))
        yield made
    finally:
        for pod in made:
            pod.stop()


def restore_into(executor: CachingExecutor, pod: Pod, artifact: Path, digest: str) -> tuple[str, int]:
    """(where the artifact was read, the restored worker's host PID)"""
    result = executor.restore(replace(restore_request(pod, artifact, digest), content=CONTENT))
    assert result.pids and proctree.pid_ns(result.pids[0]) == proctree.pid_ns(pod.init_pid)
    return result.source, result.pids[0]


def test_restores_through_the_cache_are_bit_exact_and_a_changed_entry_is_never_restored(
    pods: list[Pod], tmp_path: Path
) -> None:
    src, first, second = pods
    port, ns_pid, _ = src.start_worker(tmp_path / "worker", bulk_mib=48)
    before = http_get(port)
    host_pid = proctree.host_pid_in_ns(ns_pid, src.init_pid)
    assert host_pid is not None and before["bulk"]
    engine = EngineExecutor()
    artifact = tmp_path / "volume" / "ns" / "snap"
    captured = engine.capture(capture_request(host_pid, artifact))
    bulk = sorted((artifact / "bulk").iterdir())
    assert bulk, "the worker's large region left CRIU's images (the files a cached restore skips hashing)"

    cache = ArtifactCache(
        tmp_path / "cache", engine, max_bytes=1 << 30, min_free_percent=0, metrics=CacheMetrics(CollectorRegistry())
    ).open()
    filler = Filler(cache, IOGate())
    executor = CachingExecutor(engine, cache, filler, fill_after_restore=False)
    key = CacheKey(CONTENT, captured.digest)
    try:
        assert cache.fill(key, artifact), "copied and verified by the engine"
        entry = cache.entries[key].artifact

        # not the volume's path: only the cache can serve this restore
        source, pid = restore_into(executor, first, tmp_path / "not-the-volume", captured.digest)
        assert source == "cache"
        after = http_get(port)
        assert (after["init_id"], after["state"], after["bulk"]) == (before["init_id"], before["state"], before["bulk"])
        first.stop()  # the restored worker goes with its pod, and frees the port
        assert proctree.wait_gone(pid, timeout_s=10)

        # a byte of the cached bulk memory changes, size and name kept: hashing would be skipped, the seal
        # still sees it
        victim = next(p for p in sorted((entry / "bulk").iterdir()) if p.stat().st_size > 8192)
        with victim.open("r+b") as f:
            f.seek(4096)
            byte = f.read(1)
            f.seek(4096)
            f.write(bytes([byte[0] ^ 0x5A]))
        assert restore_into(executor, second, artifact, captured.digest)[0] == "volume"
        assert not cache.contains(key) and not entry.exists(), "the changed entry was dropped"
        again = http_get(port)
        assert (again["init_id"], again["state"], again["bulk"]) == (before["init_id"], before["state"], before["bulk"])
    finally:
        filler.stop()

    # the volume's own artifact, changed after its capture, never enters the cache
    tampered = tmp_path / "volume" / "ns" / "tampered"
    shutil.copytree(artifact, tampered)
    target = tampered / "bulk" / bulk[0].name
    data = bytearray(target.read_bytes())
    data[-1] ^= 1
    target.write_bytes(bytes(data))
    fresh = ArtifactCache(tmp_path / "cache", engine, max_bytes=1 << 30, min_free_percent=0).open()
    with pytest.raises(ArtifactMismatch, match="differs from the manifest"):
        fresh.fill(key, tampered)
    assert not fresh.contains(key) and list((tmp_path / "cache" / "staging").iterdir()) == []
