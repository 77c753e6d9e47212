"""The seam between the agent (Kubernetes) and the node engine (CUDA + CRIU + artifacts).

The agent decides what to capture or restore and reports the outcome on the API objects; an `Executor`
does the work on the host. `EngineExecutor` is the real one and calls `podsnap.engine`; tests that
cannot run CRIU substitute a recording stand-in (`tests/support/recording.py: RecordingExecutor`).

Errors an executor raises, by how the agent reacts::

    ExecutionError          the capture/restore failed -> CaptureFailed / RestoreFailed (reason carried)
    ├── IncompatibleError   a restore gate refused this host -> RestoreIncompatible (names the gate)
    └── ArtifactUnusable    the artifact is missing, tampered or truncated -> RestoreFailed, and its
                            snapshot stops being Ready (ArtifactLost): no later pod may restore from it
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from podsnap import contract as c


class ExecutionError(Exception):
    """The executor failed; `reason` becomes the condition reason, the message its message."""

    def __init__(self, message: str, *, reason: str = c.REASON_CAPTURE_FAILED) -> None:
        self.reason = reason
        super().__init__(message)


class IncompatibleError(ExecutionError):
    """A pre-restore compatibility gate refused this host."""

    def __init__(self, gate: str, message: str) -> None:
        self.gate = gate
        super().__init__(message, reason=c.REASON_RESTORE_INCOMPATIBLE)


class ArtifactUnusable(ExecutionError):
    """The artifact cannot be restored from, for any pod: missing, or failing its digests."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason=c.REASON_RESTORE_FAILED)


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str
    container: str
    container_id: str


@dataclass(frozen=True)
class CaptureRequest:
    pod: PodRef
    #: host PIDs of the container's processes; `root_pid` is the one whose parent is outside the container
    pids: tuple[int, ...]
    root_pid: int
    #: where the artifact must end up (absolute; the executor stages next to it and renames into place)
    artifact_dir: Path
    node: str
    #: the source container's image ID and memory limit (agent/gates.py), recorded with the artifact
    source_facts: dict[str, Any] = field(default_factory=dict)
    #: the PodSnapshotContent this capture is for: the capture's journal record names it, so an agent that
    #: starts after this one died knows which content to fail (agent/capture_recovery.py)
    content: str = ""
    #: root_pid's start time when the container's processes were found (`ContainerProcs.root_start`): the
    #: engine refuses the PID if it names another process by then; None: taken when the capture starts
    root_start: int | None = None


@dataclass(frozen=True)
class CaptureResult:
    size_bytes: int
    digest: str
    #: node, kernel, arch, glibc, driver, gpus[] (as in PodSnapshot.status.source)
    source: dict[str, Any] = field(default_factory=dict)
    #: phase -> milliseconds, as the engine measured them (status.captureTimingsMs)
    timings_ms: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class CaptureRecovered:
    """A capture an earlier agent of this node died in the middle of, and what was done for its source."""

    #: the PodSnapshotContent it was for ("" when the record did not say)
    content: str
    #: the journal step the capture had reached (engine step names: cuda_lock, criu_dump, ...)
    step: str
    source_alive: bool
    #: one sentence: what was found and done (e.g. "... recovered: cuCheckpointProcessRestore pid 12; ...")
    summary: str
    #: what could not be given back (the source may stay locked)
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class RestoreRequest:
    pod: PodRef
    #: host PIDs of the placeholder container (its process is what the worker is restored next to)
    placeholder_pids: tuple[int, ...]
    placeholder_root_pid: int
    artifact_dir: Path
    skip_compat: bool
    node: str
    #: the manifest digest recorded when the artifact was captured (its PodSnapshotContent's status): the
    #: artifact is trusted only through it
    expected_digest: str = ""
    #: the PodSnapshotContent the artifact belongs to (with expected_digest, the node cache's key)
    content: str = ""
    #: every file of `artifact_dir` was verified against `expected_digest` and nobody untrusted could write
    #: it since (the agent's node-local cache): the restore hashes nothing again
    verified_digests: bool = False
    #: the restore container's memory limit (bytes), for the engine's memory-limit gate; None: no limit
    memory_limit_bytes: int | None = None
    #: placeholder_root_pid's start time when found (as CaptureRequest.root_start)
    placeholder_root_start: int | None = None


@dataclass(frozen=True)
class RestoreResult:
    #: host PIDs of the restored worker (root first)
    pids: tuple[int, ...]
    #: phase -> milliseconds, as the engine measured them (the pod's restore-timings annotation)
    timings_ms: dict[str, float] = field(default_factory=dict)
    #: where the artifact was read: "volume" (the shared artifact volume) or "cache" (the node's own copy)
    source: str = "volume"


class Executor(Protocol):
    def capture(self, request: CaptureRequest) -> CaptureResult: ...

    def restore(self, request: RestoreRequest) -> RestoreResult: ...

    def check(self, artifact_dir: Path, expected_digest: str) -> None:
        """Raise ArtifactUnusable when the artifact is missing, tampered or truncated (cheap: no hashing)."""
        ...

    def remove(self, artifact_dir: Path) -> None: ...

    def recover_captures(self) -> list[CaptureRecovered]:
        """Captures an earlier process of this agent left in the middle (it died): give each source back
        what its capture took (its CUDA state, a stop), and forget the capture. Runs at start, before any
        capture of this process."""
        ...

    def artifact_files(self, artifact: Path, digest: str) -> list[tuple[str, int]]:
        """(relative path, size) of manifest.json and every file the manifest `digest` names lists;
        ArtifactUnusable when manifest.json is not that manifest."""
        ...

    def verify_artifact(self, artifact: Path, digest: str) -> int:
        """Check every file of `artifact` (digests included) against the manifest `digest` names; the
        bytes checked. ArtifactUnusable on any mismatch."""
        ...
