"""The real `Executor`: drives `podsnap.engine` inside the pod's namespaces.

CRIU runs in the target container's namespaces (`namespace_pid` = the container's root process), so the
worker comes back in the restore pod with the same namespace PID, parented by the pod's PID 1 (pause,
thanks to `shareProcessNamespace`), and its sockets on the new pod IP. Engine errors become the agent's
reasons here and nowhere else.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from podsnap import contract as c
from podsnap.agent.executor import (
    CaptureRequest,
    CaptureResult,
    ExecutionError,
    IncompatibleError,
    RestoreRequest,
    RestoreResult,
)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return f"sha256:{digest.hexdigest()}"


def source_facts(facts: Any) -> dict[str, Any]:
    """HostFacts -> PodSnapshot.status.source (node is set by the agent)."""
    return {
        "kernel": facts.kernel,
        "arch": facts.arch,
        "glibc": facts.glibc,
        "driver": facts.driver_version or "",
        "gpus": [g.to_dict() for g in facts.gpus],
    }


class EngineExecutor:
    def capture(self, request: CaptureRequest) -> CaptureResult:
        from podsnap import engine

        request.artifact_dir.parent.mkdir(parents=True, exist_ok=True)
        pod = request.pod
        options = engine.CaptureOptions(
            namespace_pid=request.root_pid,
            criu=engine.CriuOptions(tcp="close"),
            extra={"pod": {"namespace": pod.namespace, "name": pod.name, "uid": pod.uid, "container": pod.container}},
        )
        try:
            result = engine.capture(request.root_pid, request.artifact_dir, options)
        except engine.EngineError as exc:
            raise ExecutionError(str(exc), reason=c.REASON_CAPTURE_FAILED) from exc
        return CaptureResult(
            size_bytes=result.bytes_total,
            digest=_sha256(result.artifact / engine.MANIFEST_NAME),
            source=source_facts(result.manifest.source),
        )

    def restore(self, request: RestoreRequest) -> RestoreResult:
        from podsnap import engine

        if request.expected_digest:
            # the manifest lists every file's digest, which the engine verifies; the manifest itself is
            # trusted only as recorded at capture (TODO engine: RestoreOptions.expected_manifest_digest,
            # which checks the bytes it then reads)
            manifest = request.artifact_dir / engine.MANIFEST_NAME
            try:
                found = _sha256(manifest)
            except OSError as exc:
                raise ExecutionError(f"artifact {request.artifact_dir}: {exc}", reason=c.REASON_RESTORE_FAILED) from exc
            if found != request.expected_digest:
                raise ExecutionError(
                    f"artifact {request.artifact_dir}: manifest digest {found} is not the captured "
                    f"{request.expected_digest}; the artifact was changed after its capture",
                    reason=c.REASON_RESTORE_FAILED,
                )
        options = engine.RestoreOptions(
            namespace_pid=request.placeholder_root_pid,
            skip_compat=request.skip_compat,
            criu=engine.CriuOptions(tcp="close"),
        )
        try:
            result = engine.restore(request.artifact_dir, options)
        except engine.CompatibilityError as exc:
            raise IncompatibleError(exc.gate, str(exc)) from exc
        except engine.EngineError as exc:
            raise ExecutionError(str(exc), reason=c.REASON_RESTORE_FAILED) from exc
        return RestoreResult(pids=result.pids or (result.pid,))

    def remove(self, artifact_dir: Path) -> None:
        from podsnap import engine

        engine.remove_artifact(artifact_dir)
