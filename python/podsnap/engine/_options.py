"""Options, results and progress reports of the capture and restore workflows."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from podsnap.engine import _digest
from podsnap.engine._artifact import parse_digest
from podsnap.engine._bulk import DEFAULT_MIN_RUN
from podsnap.engine._compat import GateFailure
from podsnap.engine._criu_config import CriuOptions
from podsnap.engine._cuda import DEFAULT_LOCK_TIMEOUT_MS
from podsnap.engine._manifest import PAGE_SIZE, Manifest


@dataclass(frozen=True)
class Progress:
    """One report from a long phase: bytes `done` of `total` (0 when unknown); `finished` on its last report."""

    phase: str
    done: int = 0
    total: int = 0
    finished: bool = False
    elapsed_ms: float = 0.0


ProgressFn = Callable[[Progress], None]


@dataclass(frozen=True)
class CaptureOptions:
    """How to capture. All fields have working defaults for a plain process on this host."""

    #: run CRIU inside this host PID's namespaces (a pod's container init); `pid` stays a host PID
    namespace_pid: int | None = None
    #: namespace_pid's start time when the caller chose it (`process_start_time`): the capture is refused
    #: when the PID now belongs to another process. None: not checked (a PID found just before the call)
    namespace_start: int | None = None
    criu: CriuOptions = field(default_factory=CriuOptions)
    #: auto: checkpoint the CUDA processes found in the tree; on: require at least one; off: CPU state only
    cuda: Literal["auto", "on", "off"] = "auto"
    cuda_lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS
    #: keep the source running after the dump (CUDA state is restored and unlocked again)
    leave_running: bool = False
    #: free-form manifest sections (e.g. {"pod": {...}}, later weight shards), JSON-serializable
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: CRIU binary to use (default: PODSNAP_CRIU, .tools/bin/criu, PATH)
    criu_binary: Path | None = None
    #: threads hashing the artifact (None: one per core, at most 16)
    hash_workers: int | None = None
    #: hook run with the staging dir after the dump, before hashing: add files (a rootfs diff, weight
    #: shards) and return manifest `extra` sections describing them; added files are digested like CRIU's
    before_publish: Callable[[Path], Mapping[str, Any]] | None = None
    #: where the log of a failed CRIU run is copied (a fresh dir per run, named in the error). CRIU's work
    #: dir (config, log) itself is always private, in the system temp dir, never here: this may be on the
    #: artifact volume. None: the private work dir of a failed run is kept instead. On success the dump
    #: log goes into the artifact's logs/.
    log_dir: Path | None = None
    #: cut large memory runs out of CRIU's images so a restore writes them in parallel (schema 2);
    #: False writes the schema 1 layout, which every podsnap restores
    fast_restore: bool = True
    #: the smallest run of private anonymous memory worth moving out of CRIU's images
    bulk_min_run_bytes: int = DEFAULT_MIN_RUN
    #: add MADV_HUGEPAGE to the mappings the bulk memory mostly fills (in CRIU's mm image, which CRIU
    #: replays at restore): the fill and the CUDA driver's restore then work on 2 MiB pages where the
    #: host's THP mode is `madvise` (the usual one). False leaves every mapping's advice as it was.
    bulk_hugepages: bool = True
    #: the algorithm of the artifact's file digests (`_digest`): blake3 (fast; manifest schema 3, which an
    #: older podsnap refuses naming the fix) or sha256 (the layout every podsnap restores)
    digest: str = _digest.DEFAULT
    #: a journal record of the capture's steps, kept at this path while the capture runs (see _journal):
    #: whoever finds it after this process died gives the source back its CUDA state (`recover_capture`).
    #: None: no journal. Its directory should be node-local state that outlives the capturing process.
    journal: Path | None = None
    #: free-form strings kept in the journal record for whoever recovers it (e.g. what the capture was for)
    journal_note: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _digest.check(self.digest, field="CaptureOptions.digest")
        if self.bulk_min_run_bytes < PAGE_SIZE:
            raise ValueError(f"CaptureOptions.bulk_min_run_bytes {self.bulk_min_run_bytes}: at least one page")


@dataclass(frozen=True)
class RestoreOptions:
    """How to restore. `skip_compat` is the only way past a failed compatibility gate."""

    #: restore inside this host PID's namespaces (the placeholder container's init)
    namespace_pid: int | None = None
    #: namespace_pid's start time when the caller chose it (`process_start_time`): the restore is refused
    #: when the PID now belongs to another process. None: not checked (a PID found just before the call)
    namespace_start: int | None = None
    #: in namespace mode, join `namespace_pid`'s cgroups before CRIU forks the tree, so the restored tree
    #: lives (and is limited and accounted) in the destination container, not in the caller's cgroups
    join_cgroups: bool = True
    #: the host's cgroup filesystem as mounted here: in a container, /sys/fs/cgroup shows only the
    #: container's own cgroups, so the agent mounts the host's elsewhere and names it here
    cgroup_root: Path = Path("/sys/fs/cgroup")
    skip_compat: bool = False
    #: the destination container's memory limit, when known: gate `memory-limit`
    memory_limit_bytes: int | None = None
    criu: CriuOptions = field(default_factory=CriuOptions)
    #: old GPU UUID -> new GPU UUID; None: keep UUIDs present here, else pair by index
    gpu_map: Mapping[str, str] | None = None
    #: network namespace file joined when `criu.external_net_ns` is set (e.g. /proc/PID/ns/net)
    net_ns: Path | None = None
    #: where CRIU's config, log and pidfile go, kept afterwards; it must be private to this process and
    #: node-local (CRIU, as root, obeys the config there). Default: a fresh 0700 dir in the system temp dir,
    #: removed afterwards
    work_dir: Path | None = None
    #: where the log of a failed restore is copied (a fresh dir per run, named in the error); never CRIU's
    #: work dir, since this may be on the artifact volume. None: the private work dir of a failed run is kept
    log_dir: Path | None = None
    criu_binary: Path | None = None
    #: threads hashing the artifact (None: one per core, at most 16)
    hash_workers: int | None = None
    #: hook run after digests and gates passed, before CRIU restores (e.g. apply a rootfs diff)
    before_restore: Callable[[Path, Manifest], None] | None = None
    #: sha256 of manifest.json as recorded at capture (`sha256:<hex>`, CaptureResult.manifest_digest):
    #: checked before anything in the artifact is parsed. None trusts the artifact's own manifest.
    expected_manifest_digest: str | None = None
    #: threads writing the bulk memory of a schema-2 artifact into the stopped tree (None: cores, at most 16)
    fill_workers: int | None = None
    #: the caller vouches that every file of the artifact was checked against the digests of the manifest
    #: `expected_manifest_digest` names, and that nobody who is not trusted could change them since: a
    #: node-local copy verified once when it was cached, on storage only the agent writes. The restore then
    #: checks the manifest's digest, every file's type and size and that nothing unlisted is there, but
    #: hashes nothing (no verify pass, no per-chunk check in the fill). Never the default: an artifact on a
    #: shared volume is read by a restore exactly as anyone with write access there left it.
    verified_digests: bool = False

    def __post_init__(self) -> None:
        if self.expected_manifest_digest is not None:
            try:
                parse_digest(self.expected_manifest_digest)
            except ValueError as exc:
                raise ValueError(f"RestoreOptions.expected_manifest_digest: {exc}") from None
        if self.verified_digests and self.expected_manifest_digest is None:
            raise ValueError(
                "RestoreOptions.verified_digests needs expected_manifest_digest: the files were verified against "
                "one manifest, and only its recorded digest says this is that manifest"
            )
        if self.fill_workers is not None and self.fill_workers < 1:
            raise ValueError(f"RestoreOptions.fill_workers {self.fill_workers}: at least 1")


@dataclass(frozen=True)
class CaptureResult:
    artifact: Path
    manifest: Manifest
    #: phase -> milliseconds (inspect, cuda_lock, cuda_checkpoint, criu_dump, hash, publish, total)
    timings_ms: dict[str, float]
    bytes_total: int
    #: host memory the dump holds (CRIU pages and bulk extents, GPU memory included)
    bytes_memory: int
    cuda_pids: tuple[int, ...]
    #: `sha256:<hex>` of manifest.json: record it, and pass it as RestoreOptions.expected_manifest_digest
    manifest_digest: str = ""
    #: phase -> bytes it handled (criu_dump: images written, cut: memory moved to bulk files, hash: hashed;
    #: `hugepages`: the mappings the cut advised MADV_HUGEPAGE, when any)
    phase_bytes: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class RestoreResult:
    #: host PID of the restored root process (re-parented to init, or to the pod's PID 1)
    pid: int
    #: its PID inside the destination's PID namespace (== pid on the host)
    ns_pid: int
    #: host PIDs of the restored tree, root first, in the manifest's order (where still found)
    pids: tuple[int, ...]
    manifest: Manifest
    #: phase -> milliseconds (read_manifest, verify, compat, criu_restore, fill, resume, cuda_restore,
    #: cuda_unlock, total); fill and resume only for a schema-2 artifact
    timings_ms: dict[str, float]
    #: the artifact's size
    bytes_total: int
    cuda_pids: tuple[int, ...]
    #: gates that failed but were skipped by skip_compat
    skipped_gates: tuple[GateFailure, ...] = ()
    #: phase -> bytes it handled (verify: hashed before CRIU ran, criu_restore: CRIU's pages, fill: bulk
    #: memory written, digest-checked unless verified_digests): rates are these over timings_ms
    phase_bytes: dict[str, int] = field(default_factory=dict)


class Timer:
    """Phase timings in milliseconds, with progress start/end reports."""

    def __init__(self, progress: ProgressFn | None) -> None:
        self.timings: dict[str, float] = {}
        self.progress = progress
        self._t0 = time.perf_counter()
        self._done: dict[str, int] = {}
        self._totals: dict[str, int] = {}
        #: the phase running, or the last one started: where a failure happened
        self.current = ""
        #: phase -> bytes it reported done at its end (phases that handle bytes)
        self.bytes: dict[str, int] = {}

    def report(self, phase: str, done: int = 0, total: int = 0, *, finished: bool = False, start: float = 0.0) -> None:
        if self.progress is not None:
            elapsed = (time.perf_counter() - start) * 1000 if start else 0.0
            self.progress(Progress(phase, done, total, finished, elapsed))

    @contextmanager
    def phase(self, name: str, total: int = 0) -> Iterator[float]:
        """Time a phase; its last report says `total` bytes done unless `set_done` said otherwise."""
        start = time.perf_counter()
        self.current = name
        self._done[name] = total
        self.report(name, 0, total, start=start)
        try:
            yield start
        finally:
            self.timings[name] = self.timings.get(name, 0.0) + (time.perf_counter() - start) * 1000
        done = self._done.pop(name, total)
        if done:
            self.bytes[name] = done
        self.report(name, done, self._totals.pop(name, done), finished=True, start=start)

    def set_done(self, name: str, done: int, *, total: int | None = None) -> None:
        """What the phase's last report says: `done` bytes, of `total` (default: of `done`)."""
        self._done[name] = done
        if total is not None:
            self._totals[name] = total

    def finish(self) -> dict[str, float]:
        self.timings["total"] = (time.perf_counter() - self._t0) * 1000
        return {k: round(v, 3) for k, v in self.timings.items()}
