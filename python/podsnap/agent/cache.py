"""The node-local artifact cache: verified copies of artifacts on the node's own storage, size-bounded,
least-recently-used whole artifacts evicted first.

Layout under the cache root (mode 0700; a hostPath or emptyDir that only the agent mounts)::

    ROOT/
      entries/<content>@<sha256 hex>/   one artifact, complete and verified (renamed into place whole)
        entry.json                      content, manifest digest, bytes, and the seal of every file
        artifact/                       the artifact's files, exactly those its manifest lists
      staging/<random>/                 fills in progress (removed when the agent starts)
      trash/                            entries being deleted (renamed out of entries/ first)

Trust. An artifact on the shared volume is hostile until checked, and is trusted only through the
manifest digest its PodSnapshotContent recorded (DESIGN.md, security model). A fill copies exactly the
files of the manifest that digest names, from the volume, without following symlinks, then checks the
copy IN FULL against it (`ArtifactVerifier.verify`: every file's sha256, bulk files too) before it
renames it into entries/. From then on the copy lives where nobody but the agent writes, so a restore
from it may skip hashing (the engine's `RestoreOptions.verified_digests`), on three conditions checked
at every use (`lookup`):
- the entry is the one filled for this content and this digest (its entry.json and its name say so);
- its manifest.json still hashes to that digest (a swapped entry is another artifact's);
- every file still has the inode, size, mtime and ctime recorded after verification (the seal): any
  write through the filesystem since then changes the ctime, which no one can set back.
An entry failing any of them is dropped, and the restore reads the volume, fully verified. What the seal
cannot see is a change below the filesystem (media corruption, root writing the block device): the
storage's own checksums are for that, and root on the node is trusted anyway.

An entry can only be used for the artifact (content name + manifest digest) it was filled from, so an
artifact serves only the namespace that captured it, as from the volume. Entries in use by a restore are
never evicted (they are pinned by a `Lease`); a dropped entry in use is deleted when its last lease ends.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

log = logging.getLogger(__name__)

ENTRY_FILE = "entry.json"
ARTIFACT_DIR = "artifact"
MANIFEST = "manifest.json"
#: bytes one copy task moves; a fill's tasks run on `copy_workers` threads (parallel readers help a
#: network volume most)
COPY_CHUNK = 64 << 20
_SEND = 8 << 20
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_HEX = re.compile(r"^[0-9a-f]{64}$")
SECONDS = (0.1, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800)


class CacheError(Exception):
    """A fill that cannot complete; the message says why (and whether the volume's artifact is at fault)."""


class ArtifactMismatch(CacheError):
    """The artifact on the volume does not match the digest its content recorded: tampered or corrupted."""


class ArtifactVerifier(Protocol):
    """What the cache needs from the engine (the agent's executor provides it)."""

    def artifact_files(self, artifact: Path, digest: str) -> list[tuple[str, int]]:
        """(path relative to the artifact, size) of manifest.json and of every file its manifest lists,
        after checking that manifest.json hashes to `digest`."""
        ...

    def verify_artifact(self, artifact: Path, digest: str) -> int:
        """Check every file of `artifact` against the manifest `digest` names; the bytes checked.
        Raises ExecutionError (ArtifactUnusable) on any mismatch."""
        ...


@dataclass(frozen=True)
class CacheKey:
    """What an entry is for: one PodSnapshotContent's artifact, as its manifest digest names it."""

    content: str
    digest: str  # sha256:<hex>

    def __post_init__(self) -> None:
        if not _NAME.match(self.content):
            raise ValueError(f"cache key: {self.content!r} is not a PodSnapshotContent name")
        if not (self.digest.startswith("sha256:") and _HEX.match(self.digest.removeprefix("sha256:"))):
            raise ValueError(f"cache key: {self.digest!r} is not a manifest digest (sha256:<64 hex digits>)")

    @property
    def dirname(self) -> str:
        return f"{self.content}@{self.digest.removeprefix('sha256:')}"


@dataclass
class Entry:
    key: CacheKey
    path: Path  # the entry's directory
    size: int
    seal: dict[str, list[int]]
    last_used: float
    pins: int = 0
    #: dropped while pinned: deleted when the last lease ends
    doomed: bool = False

    @property
    def artifact(self) -> Path:
        return self.path / ARTIFACT_DIR


@dataclass
class FillProgress:
    key: CacheKey
    total: int
    #: time.monotonic() when the copy began (0 before)
    copy_started: float = 0.0
    copied: int = 0
    verifying: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    ok: bool = False

    def copy_rate(self) -> float:
        """Bytes per second the copy has moved so far (0 before it has a measure)."""
        elapsed = time.monotonic() - self.copy_started if self.copy_started else 0.0
        return self.copied / elapsed if elapsed > 0 and self.copied else 0.0


class CacheMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.hits = Counter("podsnap_agent_cache_hits_total", "Restores that read the node cache", registry=registry)
        self.misses = Counter(
            "podsnap_agent_cache_misses_total", "Restores that read the volume: no usable entry", registry=registry
        )
        self.bytes = Gauge("podsnap_agent_cache_bytes", "Bytes of artifacts the node cache holds", registry=registry)
        self.entries = Gauge("podsnap_agent_cache_entries", "Artifacts the node cache holds", registry=registry)
        self.max_bytes = Gauge("podsnap_agent_cache_max_bytes", "The node cache's size limit", registry=registry)
        self.evictions = Counter(
            "podsnap_agent_cache_evictions_total",
            "Entries removed, by reason (lru, dropped: failed a check at use, released: content gone)",
            ["reason"],
            registry=registry,
        )
        self.fills = Counter(
            "podsnap_agent_cache_fills_total",
            "Fills, by result (filled, mismatch: the volume's artifact failed verification, skipped, failed)",
            ["result"],
            registry=registry,
        )
        self.fill_bytes = Counter(
            "podsnap_agent_cache_fill_bytes_total", "Bytes copied into the node cache", registry=registry
        )
        self.fill_seconds = Histogram(
            "podsnap_agent_cache_fill_seconds",
            "Fill duration (copy and verification)",
            buckets=SECONDS,
            registry=registry,
        )


class Lease:
    """A pinned entry: not evicted while held. Use as a context manager."""

    def __init__(self, cache: ArtifactCache, entry: Entry) -> None:
        self.cache, self.entry = cache, entry
        self._held = True

    @property
    def path(self) -> Path:
        """The artifact directory to restore from."""
        return self.entry.artifact

    def release(self) -> None:
        if self._held:
            self._held = False
            self.cache._unpin(self.entry)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *_: object) -> None:
        self.release()


def _seal_of(artifact: Path, rels: list[str]) -> dict[str, list[int]]:
    seal = {}
    for rel in rels:
        st = os.lstat(artifact / rel)
        if not stat.S_ISREG(st.st_mode):
            raise CacheError(f"{artifact / rel}: not a regular file")
        seal[rel] = [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    return seal


def _open_beneath(root: Path, rel: str) -> int:
    """Open the regular file `rel` under `root` for reading, following no symlink on the way."""
    parts = rel.split("/")
    if not rel or any(p in ("", ".", "..") for p in parts):
        raise CacheError(f"{rel!r}: not a plain relative path")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
        out = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=fd)
    except OSError as exc:
        what = "a symlink" if exc.errno in (errno.ELOOP, errno.ENOTDIR) else exc.strerror
        raise ArtifactMismatch(f"{root / rel}: cannot be read safely ({what})") from exc
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(out).st_mode):
        os.close(out)
        raise ArtifactMismatch(f"{root / rel}: not a regular file")
    return out


def _copy_range(src: int, dst: int, offset: int, length: int) -> None:
    """Copy `length` bytes at `offset` from `src` to the same offset of `dst` (sendfile, else read/write)."""
    os.lseek(dst, offset, os.SEEK_SET)
    done = 0
    while done < length:
        want = min(_SEND, length - done)
        try:
            n = os.sendfile(dst, src, offset + done, want)
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise
            data = os.pread(src, want, offset + done)
            n = os.write(dst, data) if data else 0
        if n == 0:
            raise ArtifactMismatch(f"the source ended {length - done} bytes early (truncated while copying?)")
        done += n


class ArtifactCache:
    """The cache on disk and its index. Thread-safe: restores, fills and the prefetch watch share it."""

    def __init__(
        self,
        root: Path,
        verifier: ArtifactVerifier,
        *,
        max_bytes: int,
        min_free_percent: int = 15,
        copy_workers: int = 4,
        metrics: CacheMetrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_bytes <= 0:
            raise ValueError(f"cache max_bytes {max_bytes}: must be positive")
        if not 0 <= min_free_percent < 100:
            raise ValueError(f"cache min_free_percent {min_free_percent}: 0-99")
        self.root = root
        self.verifier = verifier
        self.max_bytes = max_bytes
        self.min_free_percent = min_free_percent
        self.copy_workers = max(1, copy_workers)
        self.metrics = metrics or CacheMetrics(CollectorRegistry())
        self.clock = clock
        self.entries: dict[CacheKey, Entry] = {}
        self.filling: dict[CacheKey, FillProgress] = {}
        #: bytes held by entries (doomed ones too, until deleted) and reserved by fills in progress
        self._reserved = 0
        self._lock = threading.RLock()
        #: set when the agent stops: fills end at their next chunk and leave nothing behind
        self.stopping = threading.Event()
        #: measured sha256 rate of past fills' verification (bytes/s); 0 until one was measured
        self.verify_rate = 0.0
        self.metrics.max_bytes.set(max_bytes)

    # --- start ----------------------------------------------------------------------------------
    def open(self) -> ArtifactCache:
        """Make the directories, forget half-done work of an earlier agent, load the entries, enforce limits."""
        for sub in ("", "entries", "staging", "trash"):
            (self.root / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        self.root.chmod(0o700)
        for sub in ("staging", "trash"):
            for child in (self.root / sub).iterdir():
                shutil.rmtree(child, ignore_errors=True)
        for path in sorted((self.root / "entries").iterdir()):
            entry = self._load(path)
            if entry is None:
                log.warning("artifact cache: removing %s, not a complete entry", path)
                self._delete(path)
            else:
                self.entries[entry.key] = entry
        with self._lock:
            self._reserved = sum(e.size for e in self.entries.values())
            self._make_room(0)
            self._publish()
        return self

    def _load(self, path: Path) -> Entry | None:
        try:
            record = json.loads((path / ENTRY_FILE).read_text())
            key = CacheKey(str(record["content"]), str(record["digest"]))
            seal = {str(k): [int(x) for x in v] for k, v in dict(record["seal"]).items()}
            if key.dirname != path.name or not seal:
                return None
            return Entry(key, path, int(record["bytes"]), seal, (path / ENTRY_FILE).stat().st_mtime)
        except (OSError, ValueError, KeyError, TypeError):
            return None

    # --- use ------------------------------------------------------------------------------------
    def lookup(self, key: CacheKey) -> Lease | None:
        """A lease on the entry for `key` when there is one that passes its checks (see the module doc);
        an entry that fails them is dropped."""
        with self._lock:
            entry = self.entries.get(key)
            if entry is None:
                return None
            entry.pins += 1
        problem = self._check(entry)
        if problem:
            log.warning("artifact cache: dropping %s: %s", entry.path.name, problem)
            self.drop(key, reason="dropped")
            self._unpin(entry)
            return None
        entry.last_used = self.clock()
        with contextlib.suppress(OSError):
            os.utime(entry.path / ENTRY_FILE, (entry.last_used, entry.last_used))
        return Lease(self, entry)

    def _check(self, entry: Entry) -> str:
        """Why `entry` must not be used; "" when it may."""
        try:
            raw = _read_regular(entry.artifact / MANIFEST)
        except (OSError, CacheError) as exc:
            return f"manifest unreadable ({exc})"
        if f"sha256:{hashlib.sha256(raw).hexdigest()}" != entry.key.digest:
            return "its manifest is not the one recorded for this content (swapped or changed)"
        for rel, want in entry.seal.items():
            try:
                st = os.lstat(entry.artifact / rel)
            except OSError:
                return f"{rel} is missing"
            got = [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
            if not stat.S_ISREG(st.st_mode) or got != want:
                return f"{rel} changed after it was verified"
        return ""

    def _unpin(self, entry: Entry) -> None:
        with self._lock:
            entry.pins -= 1
            if entry.pins == 0 and entry.doomed:
                self._remove(entry)

    def drop(self, key: CacheKey, *, reason: str) -> bool:
        """Remove the entry for `key` now, or when its last lease ends; False when there is none."""
        with self._lock:
            entry = self.entries.pop(key, None)
            if entry is None:
                return False
            self.metrics.evictions.labels(reason).inc()
            if entry.pins:
                entry.doomed = True
            else:
                self._remove(entry)
            self._publish()
            return True

    def release(self, content: str, *, gone: bool) -> None:
        """The content no longer needs prefetching: drop its entries when it is `gone`, else make them the
        first to be evicted."""
        with self._lock:
            keys = [k for k in self.entries if k.content == content]
            for key in keys:
                if gone:
                    self.drop(key, reason="released")
                else:
                    self.entries[key].last_used = 0.0

    def contains(self, key: CacheKey) -> bool:
        with self._lock:
            return key in self.entries

    def progress(self, key: CacheKey) -> FillProgress | None:
        with self._lock:
            return self.filling.get(key)

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return self._reserved

    # --- fill -----------------------------------------------------------------------------------
    def fill(
        self,
        key: CacheKey,
        source: Path,
        *,
        wait_idle: Callable[[], None] | None = None,
    ) -> bool:
        """Copy the artifact at `source` into the cache for `key`, verify the copy in full, publish it.

        True when the entry exists afterwards (filled now or before). False when it was skipped: another
        fill of it runs, it cannot fit, or the agent is stopping. Raises ArtifactMismatch when the volume's
        artifact fails verification and CacheError when the copy fails; nothing partial stays either way.
        `wait_idle` is called between chunks: it blocks while restores or captures need the I/O.
        """
        with self._lock:
            if key in self.entries:
                return True
            if key in self.filling:
                return False
        started = time.monotonic()
        try:
            files = self.verifier.artifact_files(source, key.digest)
        except Exception as exc:
            self.metrics.fills.labels("mismatch").inc()
            raise ArtifactMismatch(f"{source}: {exc}") from exc
        total = sum(size for _, size in files)
        progress = FillProgress(key, total)
        with self._lock:
            if key in self.entries or key in self.filling:
                return key in self.entries
            if not self._make_room(total):
                self.metrics.fills.labels("skipped").inc()
                log.warning(
                    "artifact cache: %s (%d bytes) does not fit (max %d bytes, %d%% of the disk kept free)",
                    key.dirname,
                    total,
                    self.max_bytes,
                    self.min_free_percent,
                )
                return False
            self._reserved += total
            self.filling[key] = progress
            self._publish()
        staging = self.root / "staging" / uuid.uuid4().hex
        ok = False
        try:
            ok = self._fill_into(key, source, files=files, staging=staging, progress=progress, wait_idle=wait_idle)
            return ok
        finally:
            with self._lock:
                self.filling.pop(key, None)
                if not ok:
                    self._reserved -= total
                self._publish()
            progress.ok = ok
            progress.done.set()
            shutil.rmtree(staging, ignore_errors=True)
            if ok:
                self.metrics.fill_seconds.observe(time.monotonic() - started)
                self.metrics.fill_bytes.inc(total)

    def _fill_into(
        self,
        key: CacheKey,
        source: Path,
        *,
        files: list[tuple[str, int]],
        staging: Path,
        progress: FillProgress,
        wait_idle: Callable[[], None] | None,
    ) -> bool:
        art = staging / ARTIFACT_DIR
        art.mkdir(parents=True, mode=0o700)
        tasks: list[tuple[str, int, int]] = []
        for rel, size in files:
            dst = art / rel
            dst.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            with dst.open("wb") as f:
                f.truncate(size)
            tasks.extend((rel, off, min(COPY_CHUNK, size - off)) for off in range(0, size, COPY_CHUNK))
        lock = threading.Lock()

        def copy(task: tuple[str, int, int]) -> None:
            rel, offset, length = task
            if wait_idle is not None:
                wait_idle()
            if self.stopping.is_set():
                raise CacheError("the agent is stopping")
            src = _open_beneath(source, rel)
            try:
                dst = os.open(art / rel, os.O_WRONLY | os.O_CLOEXEC)
                try:
                    _copy_range(src, dst, offset, length)
                finally:
                    os.close(dst)
            finally:
                os.close(src)
            with lock:
                progress.copied += length

        progress.copy_started = time.monotonic()
        try:
            with ThreadPoolExecutor(max_workers=self.copy_workers, thread_name_prefix="cache-copy") as pool:
                list(pool.map(copy, tasks))
        except ArtifactMismatch:
            self.metrics.fills.labels("mismatch").inc()
            raise
        except CacheError:
            if self.stopping.is_set():
                self.metrics.fills.labels("skipped").inc()
                return False
            self.metrics.fills.labels("failed").inc()
            raise
        except OSError as exc:
            self.metrics.fills.labels("failed").inc()
            raise CacheError(f"copying {source} into the cache: {exc}") from exc
        for rel, size in files:  # the source may have changed size meanwhile: what was read is what counts
            if (art / rel).stat().st_size != size:
                self.metrics.fills.labels("mismatch").inc()
                raise ArtifactMismatch(f"{source / rel}: changed size while it was copied")
        progress.verifying = True
        t_verify = time.monotonic()
        try:
            self.verifier.verify_artifact(art, key.digest)
        except Exception as exc:
            self.metrics.fills.labels("mismatch").inc()
            raise ArtifactMismatch(f"{source}: {exc}") from exc
        elapsed = time.monotonic() - t_verify
        if elapsed > 0 and progress.total:
            self.verify_rate = progress.total / elapsed
        self._seal_and_publish(key, staging, [rel for rel, _ in files], progress.total)
        self.metrics.fills.labels("filled").inc()
        return True

    def _seal_and_publish(self, key: CacheKey, staging: Path, rels: list[str], total: int) -> None:
        art = staging / ARTIFACT_DIR
        for rel in rels:  # durable before the entry is: a crash must not leave a published entry half-written
            fd = os.open(art / rel, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        seal = _seal_of(art, rels)
        record = {"content": key.content, "digest": key.digest, "bytes": total, "seal": seal}
        with (staging / ENTRY_FILE).open("w") as f:
            json.dump(record, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        dest = self.root / "entries" / key.dirname
        with self._lock:
            if dest.exists():  # a leftover of an entry dropped earlier and not yet deleted
                self._delete(dest)
            staging.rename(dest)
            self.entries[key] = Entry(key, dest, total, seal, self.clock())
        _fsync_dir(dest.parent)

    # --- room -----------------------------------------------------------------------------------
    def _free_after(self, size: int) -> bool:
        st = os.statvfs(self.root)
        free, whole = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
        return free - size >= whole * self.min_free_percent / 100

    def _make_room(self, size: int) -> bool:
        """Evict least-recently-used unpinned entries until `size` more bytes fit; False when they cannot."""
        if size > self.max_bytes:
            return False
        while self._reserved + size > self.max_bytes or not self._free_after(size):
            victims = sorted((e for e in self.entries.values() if e.pins == 0), key=lambda e: e.last_used)
            if not victims:
                return False
            victim = victims[0]
            log.info("artifact cache: evicting %s (least recently used) for %d bytes", victim.path.name, size)
            self.entries.pop(victim.key)
            self.metrics.evictions.labels("lru").inc()
            self._remove(victim)
        return True

    def _remove(self, entry: Entry) -> None:
        self._reserved -= entry.size
        self._delete(entry.path)
        self._publish()

    def _delete(self, path: Path) -> None:
        aside = self.root / "trash" / f"{path.name}.{uuid.uuid4().hex[:8]}"
        try:
            path.rename(aside)
        except OSError:
            aside = path
        shutil.rmtree(aside, ignore_errors=True)

    def _publish(self) -> None:
        self.metrics.bytes.set(sum(e.size for e in self.entries.values()))
        self.metrics.entries.set(len(self.entries))

    def snapshot(self) -> list[dict[str, Any]]:
        """The entries, most recently used first (for logs and tests)."""
        with self._lock:
            order = sorted(self.entries.values(), key=lambda e: -e.last_used)
            return [{"content": e.key.content, "digest": e.key.digest, "bytes": e.size, "pins": e.pins} for e in order]


def _read_regular(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CacheError(f"{path}: not a regular file")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read()
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class IOGate:
    """Foreground work (restores and captures reading or writing the volume) goes first: background fills
    wait at their next chunk while any runs."""

    def __init__(self) -> None:
        self._busy = 0
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def foreground(self) -> Iterator[None]:
        with self._cond:
            self._busy += 1
        try:
            yield
        finally:
            with self._cond:
                self._busy -= 1
                self._cond.notify_all()

    def wait_idle(self, stop: threading.Event | None = None, poll_s: float = 0.5) -> None:
        with self._cond:
            while self._busy and not (stop is not None and stop.is_set()):
                self._cond.wait(poll_s)

    @property
    def busy(self) -> bool:
        with self._cond:
            return self._busy > 0
