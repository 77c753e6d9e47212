"""RecordingExecutor: the agent's executor stand-in for tests that cannot run CRIU (no kubelet, no
containers here). It records every call with a monotonic timestamp, writes a small real artifact
directory (so cleanup is observable on disk), and fails on request. Real captures are tested by the
engine suite (tests/engine) and on the GPU machine."""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from podsnap.agent.executor import (
    ArtifactUnusable,
    CaptureRecovered,
    CaptureRequest,
    CaptureResult,
    ExecutionError,
    RestoreRequest,
    RestoreResult,
)

SOURCE = {"kernel": "6.1.0-test", "arch": "x86_64", "glibc": "2.36", "driver": "580.159.04", "gpus": []}
#: what the engine would report (phase -> ms); the agent puts them on the objects
CAPTURE_TIMINGS_MS = {"cuda_checkpoint": 2100.2, "criu_dump": 5300.5, "total": 7500.8}
RESTORE_TIMINGS_MS = {"verify": 750.0, "criu_restore": 1200.5, "cuda_restore": 900.2, "total": 2850.7}


@dataclass
class Call:
    op: str
    at: float
    request: Any


@dataclass
class RecordingExecutor:
    calls: list[Call] = field(default_factory=list)
    #: pod name -> exception the next capture/restore of that pod raises
    fail_capture: dict[str, ExecutionError] = field(default_factory=dict)
    fail_restore: dict[str, ExecutionError] = field(default_factory=dict)
    #: namespace -> exception every capture of a pod there raises (pod names a Job picks are not known ahead)
    fail_capture_in: dict[str, ExecutionError] = field(default_factory=dict)
    capture_delay_s: float = 0.0
    #: called with each restore request, where CRIU would run (what the agent has done before it, observed)
    during_restore: Callable[[RestoreRequest], None] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _record(self, op: str, request: Any) -> None:
        with self.lock:
            self.calls.append(Call(op, time.monotonic(), request))

    def of(self, op: str, pod: str | None = None, namespace: str | None = None) -> list[Call]:
        """Calls of `op`, optionally only those for pod `pod` (in `namespace`)."""

        def matches(call: Call) -> bool:
            ref = getattr(call.request, "pod", None)
            if pod is None:
                return True
            return ref is not None and ref.name == pod and (namespace is None or ref.namespace == namespace)

        with self.lock:
            return [c for c in self.calls if c.op == op and matches(c)]

    def recover_captures(self) -> list[CaptureRecovered]:
        self._record("recover_captures", None)
        return []

    def capture(self, request: CaptureRequest) -> CaptureResult:
        self._record("capture", request)
        if self.capture_delay_s:
            time.sleep(self.capture_delay_s)
        if request.pod.name in self.fail_capture:
            raise self.fail_capture[request.pod.name]
        if request.pod.namespace in self.fail_capture_in:
            raise self.fail_capture_in[request.pod.namespace]
        request.artifact_dir.mkdir(parents=True, exist_ok=False)
        manifest = json.dumps({"pod": request.pod.name, "pids": list(request.pids)}).encode()
        (request.artifact_dir / "manifest.json").write_bytes(manifest)
        return CaptureResult(
            size_bytes=len(manifest),
            digest="sha256:" + hashlib.sha256(manifest).hexdigest(),
            source=dict(SOURCE),
            timings_ms=dict(CAPTURE_TIMINGS_MS),
        )

    def restore(self, request: RestoreRequest) -> RestoreResult:
        self._record("restore", request)
        if self.during_restore is not None:
            self.during_restore(request)
        if request.pod.name in self.fail_restore:
            raise self.fail_restore[request.pod.name]
        self.check(request.artifact_dir, request.expected_digest)
        return RestoreResult(pids=request.placeholder_pids, timings_ms=dict(RESTORE_TIMINGS_MS))

    def check(self, artifact_dir: Path, expected_digest: str) -> None:
        """As the engine executor does: the manifest exists and matches the digest recorded at capture."""
        manifest = artifact_dir / "manifest.json"
        if not manifest.exists():
            raise ArtifactUnusable(f"{artifact_dir}: no such artifact directory")
        found = "sha256:" + hashlib.sha256(manifest.read_bytes()).hexdigest()
        if expected_digest and found != expected_digest:
            raise ArtifactUnusable(f"manifest digest {found} is not {expected_digest}: changed after its capture")

    def remove(self, artifact_dir: Path) -> None:
        self._record("remove", artifact_dir)
        shutil.rmtree(artifact_dir)

    # the node cache's checks: a recorded artifact is its manifest.json alone, so its digest is the whole check
    def artifact_files(self, artifact: Path, digest: str) -> list[tuple[str, int]]:
        self._record("artifact_files", artifact)
        return [("manifest.json", len(self._checked_manifest(artifact, digest)))]

    def verify_artifact(self, artifact: Path, digest: str) -> int:
        self._record("verify_artifact", artifact)
        return len(self._checked_manifest(artifact, digest))

    @staticmethod
    def _checked_manifest(artifact: Path, digest: str) -> bytes:
        try:
            raw = (artifact / "manifest.json").read_bytes()
        except OSError as exc:
            raise ArtifactUnusable(f"{artifact}: {exc}") from exc
        if "sha256:" + hashlib.sha256(raw).hexdigest() != digest:
            raise ArtifactUnusable(f"{artifact}/manifest.json is not the manifest {digest} names")
        return raw
