"""Restores through the node-local artifact cache (`cache.py`), and the background fills that feed it.

`CachingExecutor` wraps the agent's executor. A restore whose artifact has a usable cache entry reads
that local copy, verified when it was filled, so the engine hashes nothing again
(`RestoreRequest.verified_digests`). Without one it reads the shared volume, fully verified as ever,
and afterwards queues a fill so the next restore on this node is local. An entry the engine still
refuses (`ArtifactUnusable`) is dropped and the restore runs again from the volume.

A restore whose artifact is being filled at that moment waits for the fill when the fill will be done
sooner than a read of the whole artifact from the volume (`worth_waiting`); otherwise it reads the
volume. Fills never compete with restores and captures for I/O: they pause at their next chunk while
any runs (`IOGate`), so prefetch cannot delay or block them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from podsnap.agent.cache import (
    ArtifactCache,
    ArtifactMismatch,
    CacheError,
    CacheKey,
    FillProgress,
    IOGate,
    Lease,
)
from podsnap.agent.executor import (
    ArtifactUnusable,
    CaptureRecovered,
    CaptureRequest,
    CaptureResult,
    Executor,
    RestoreRequest,
    RestoreResult,
)

log = logging.getLogger(__name__)

#: what a verification is assumed to hash per second before a fill has measured it (one core's sha256)
DEFAULT_VERIFY_RATE = 1 << 30

#: called when a fill ends: (key, outcome, message); outcome "filled", "mismatch", "failed" or "skipped"
FillDone = Callable[[CacheKey, str, str], None]


def worth_waiting(progress: FillProgress, verify_rate: float) -> float | None:
    """Seconds to wait for an in-progress fill of the artifact a restore needs, or None to read the volume.

    Waiting costs the rest of the copy plus the fill's verification of the whole artifact; reading the
    volume costs a read of the whole artifact at the rate this fill sees on that same volume (hashing
    then runs beside it). Wait when the first is shorter. A fill without a measured rate yet is not
    waited for."""
    rate = verify_rate or DEFAULT_VERIFY_RATE
    if progress.verifying:
        return progress.total / rate
    copy_rate = progress.copy_rate()
    if copy_rate <= 0:
        return None
    remaining = (progress.total - progress.copied) / copy_rate + progress.total / rate
    from_volume = progress.total / copy_rate
    return remaining if remaining < from_volume else None


class Filler:
    """Background fills of the cache, `concurrency` at a time, each artifact once."""

    def __init__(self, cache: ArtifactCache, gate: IOGate, concurrency: int = 1) -> None:
        self.cache, self.gate = cache, gate
        self._pool = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="cache-fill")
        self._queued: dict[CacheKey, Future[None]] = {}
        self._lock = threading.Lock()

    def submit(self, key: CacheKey, source: Path, on_done: FillDone | None = None) -> bool:
        """Queue a fill of `key` from `source`; False when the entry exists or is queued already."""
        with self._lock:
            if self.cache.stopping.is_set() or key in self._queued or self.cache.contains(key):
                return False
            self._queued[key] = self._pool.submit(self._run, key, source, on_done)
            return True

    def _run(self, key: CacheKey, source: Path, on_done: FillDone | None) -> None:
        started = time.monotonic()
        try:
            filled = self.cache.fill(key, source, wait_idle=lambda: self.gate.wait_idle(self.cache.stopping))
            outcome = "filled" if filled else "skipped"
            message = f"{key.content}: {'in the node cache' if filled else 'not cached'} after {time.monotonic() - started:.1f} s"
        except ArtifactMismatch as exc:
            outcome, message = "mismatch", f"{key.content}: the artifact on the volume failed verification: {exc}"
            log.warning("artifact cache: %s", message)
        except (CacheError, OSError) as exc:
            outcome, message = "failed", f"{key.content}: the fill failed: {exc}"
            log.warning("artifact cache: %s", message)
        except Exception:  # a bug in a fill must not kill the pool's thread silently
            log.exception("artifact cache: fill of %s", key.dirname)
            outcome, message = "failed", f"{key.content}: the fill failed (see the agent's log)"
        finally:
            with self._lock:
                self._queued.pop(key, None)
        if outcome in ("filled", "skipped"):
            log.info("artifact cache: %s", message)
        if on_done is not None:
            try:
                on_done(key, outcome, message)
            except Exception:
                log.exception("artifact cache: reporting the fill of %s", key.dirname)

    def idle(self) -> bool:
        with self._lock:
            return not self._queued

    def stop(self) -> None:
        """End the fills at their next chunk (their staging dirs are removed) and wait for them."""
        self.cache.stopping.set()
        self._pool.shutdown(wait=True, cancel_futures=True)


class CachingExecutor:
    """An `Executor` whose restores read the node cache when it holds their artifact (see the module doc)."""

    def __init__(
        self, inner: Executor, cache: ArtifactCache, filler: Filler, *, fill_after_restore: bool = True
    ) -> None:
        self.inner, self.cache, self.filler = inner, cache, filler
        self.fill_after_restore = fill_after_restore

    def capture(self, request: CaptureRequest) -> CaptureResult:
        with self.filler.gate.foreground():
            return self.inner.capture(request)

    def remove(self, artifact_dir: Path) -> None:
        self.inner.remove(artifact_dir)

    def recover_captures(self) -> list[CaptureRecovered]:
        return self.inner.recover_captures()

    def check(self, artifact_dir: Path, expected_digest: str) -> None:
        self.inner.check(artifact_dir, expected_digest)

    def artifact_files(self, artifact: Path, digest: str) -> list[tuple[str, int]]:
        return self.inner.artifact_files(artifact, digest)

    def verify_artifact(self, artifact: Path, digest: str) -> int:
        return self.inner.verify_artifact(artifact, digest)

    def restore(self, request: RestoreRequest) -> RestoreResult:
        key = _key(request)
        if key is not None:
            lease = self.cache.lookup(key)
            if lease is None:
                lease = self._wait_for_fill(key)
            if lease is not None:
                with lease:
                    self.cache.metrics.hits.inc()
                    try:
                        result = self.inner.restore(replace(request, artifact_dir=lease.path, verified_digests=True))
                        return replace(result, source="cache")
                    except ArtifactUnusable as exc:
                        # the copy no longer matches: never restore it; the volume's artifact is checked anew
                        log.warning("artifact cache: %s refused (%s); restoring from the volume", lease.path, exc)
                        self.cache.drop(key, reason="dropped")
        if key is not None:
            self.cache.metrics.misses.inc()
        with self.filler.gate.foreground():
            result = self.inner.restore(replace(request, verified_digests=False))
        if key is not None and self.fill_after_restore:
            self.filler.submit(key, request.artifact_dir)
        return result

    def _wait_for_fill(self, key: CacheKey) -> Lease | None:
        progress = self.cache.progress(key)
        if progress is None:
            return None
        budget = worth_waiting(progress, self.cache.verify_rate)
        if budget is None:
            return None
        # twice the estimate: a fill slowed by another restore's I/O still wins; past that, the volume
        if not progress.done.wait(2 * budget + 1.0) or not progress.ok:
            return None
        return self.cache.lookup(key)


def _key(request: RestoreRequest) -> CacheKey | None:
    if not (request.content and request.expected_digest):
        return None
    try:
        return CacheKey(request.content, request.expected_digest)
    except ValueError:
        return None
