"""The real `Executor`: drives `podsnap.engine` inside the pod's namespaces.

CRIU runs in the target container's namespaces (`namespace_pid` = the container's root process), so the
worker comes back in the restore pod with the same namespace PID, parented by the pod's PID 1 (pause,
thanks to `shareProcessNamespace`), and its sockets on the new pod IP. Engine errors become the agent's
reasons here and nowhere else.
"""

from __future__ import annotations

import contextlib
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podsnap import contract as c
from podsnap.agent.executor import (
    ArtifactUnusable,
    CaptureRecovered,
    CaptureRequest,
    CaptureResult,
    ExecutionError,
    IncompatibleError,
    RestoreRequest,
    RestoreResult,
)
from podsnap.agent.state_dir import UnsafeStateDir, private_dir


def source_facts(facts: Any) -> dict[str, Any]:
    """HostFacts -> PodSnapshot.status.source (node is set by the agent)."""
    return {
        "kernel": facts.kernel,
        "arch": facts.arch,
        "glibc": facts.glibc,
        "driver": facts.driver_version or "",
        "gpus": [g.to_dict() for g in facts.gpus],
    }


def cuda_gpus(manifest: Any) -> list[str]:
    """The models of the GPUs whose CUDA state the artifact holds, one per GPU (what the gates `driver`,
    `gpu-model` and `gpu-count` compare; restore pods are placed by them): none without CUDA state."""
    return list(manifest.cuda_gpu_names) if manifest.cuda_pids else []


def node_facts() -> dict[str, Any]:
    """This host's facts in the shape of status.source: what the agent labels its Node with (placement)."""
    from podsnap import engine

    return source_facts(engine.host_facts())


if TYPE_CHECKING:
    from podsnap.engine import ArtifactError


def unusable(exc: ArtifactError) -> ExecutionError:
    """The agent's error for an artifact the engine refused. A format this podsnap cannot read (written by a
    newer one) is not a broken artifact: the restore fails, but the artifact is not marked lost, so a
    rollback or an agent left behind in a rolling upgrade does not destroy newer checkpoints."""
    if exc.unsupported:
        return ExecutionError(str(exc), reason=c.REASON_RESTORE_FAILED)
    return ArtifactUnusable(str(exc))


def _start(found: int | None, pid: int) -> int | None:
    """The start time the engine must find `pid` with: the one read when it was found in the container."""
    if found is not None:
        return found
    from podsnap import engine

    return engine.process_start_time(pid)


class EngineExecutor:
    """`cgroup_root`: the host's cgroup filesystem as the agent mounts it (PODSNAP_CGROUP_ROOT); restored
    workers join their pod container's cgroups through it, so they belong to that container (its limits,
    its accounting) and outlive any restart of the agent."""

    def __init__(
        self,
        cgroup_root: Path = Path("/sys/fs/cgroup"),
        log_dir: Path | None = None,
        journal_dir: Path | None = None,
        cuda: Any = None,
    ) -> None:
        self.cgroup_root = cgroup_root
        #: where CRIU's logs of failed runs are kept (on the artifact volume: they outlive the agent's pod)
        self.log_dir = log_dir
        #: the journal records of captures in flight (AgentConfig.journal_dir); None: captures keep none
        self.journal_dir = journal_dir
        #: the CUDA driver (an engine.CudaCheckpointer); None: the host's. Tests give a fake here.
        self.cuda = cuda

    def _journal(self, request: CaptureRequest) -> Path | None:
        """Where this capture's record goes; checked before each capture (state_dir.private_dir), so a record
        is never written through a symlink or into a directory someone else can write."""
        if self.journal_dir is None:
            return None
        try:
            journal = private_dir(self.journal_dir)
        except UnsafeStateDir as exc:
            raise ExecutionError(f"capture not started: {exc}", reason=c.REASON_CAPTURE_FAILED) from exc
        return journal / f"{request.content or request.pod.uid}.json"

    def capture(self, request: CaptureRequest) -> CaptureResult:
        from podsnap import engine

        request.artifact_dir.parent.mkdir(parents=True, exist_ok=True)
        # a fresh mtime: the sweep of empty namespace directories (agent/sweep.py) leaves a directory alone
        # for a while after a capture last used it, so it never removes the one this capture stages in
        with contextlib.suppress(OSError):
            request.artifact_dir.parent.touch()
        pod = request.pod
        options = engine.CaptureOptions(
            namespace_pid=request.root_pid,
            # refused if the PID names another process by then (the one found in the container exited)
            namespace_start=_start(request.root_start, request.root_pid),
            criu=engine.CriuOptions(tcp="close"),
            log_dir=self.log_dir,
            journal=self._journal(request),
            journal_note={"content": request.content, "pod": f"{pod.namespace}/{pod.name}"},
            extra={
                "pod": {
                    "namespace": pod.namespace,
                    "name": pod.name,
                    "uid": pod.uid,
                    "container": pod.container,
                    **request.source_facts,
                }
            },
        )
        try:
            result = engine.capture(request.root_pid, request.artifact_dir, options, cuda=self.cuda)
        except engine.CaptureError as exc:
            reason = c.REASON_STORAGE_FULL if exc.no_space else c.REASON_CAPTURE_FAILED
            raise ExecutionError(str(exc), reason=reason) from exc
        except engine.EngineError as exc:
            raise ExecutionError(str(exc), reason=c.REASON_CAPTURE_FAILED) from exc
        return CaptureResult(
            size_bytes=result.bytes_total,
            digest=result.manifest_digest,
            source={**source_facts(result.manifest.source), "cudaGpus": cuda_gpus(result.manifest)},
            timings_ms=dict(result.timings_ms),
        )

    def restore(self, request: RestoreRequest) -> RestoreResult:
        from podsnap import engine

        try:
            # the manifest is trusted only as recorded at capture: the engine checks the bytes it then parses
            options = engine.RestoreOptions(
                namespace_pid=request.placeholder_root_pid,
                namespace_start=_start(request.placeholder_root_start, request.placeholder_root_pid),
                cgroup_root=self.cgroup_root,
                skip_compat=request.skip_compat,
                memory_limit_bytes=request.memory_limit_bytes,
                criu=engine.CriuOptions(tcp="close"),
                expected_manifest_digest=request.expected_digest or None,
                log_dir=self.log_dir,
                # a node-cache copy, verified in full when it was filled: nothing is hashed again
                verified_digests=request.verified_digests,
            )
        except ValueError as exc:
            raise ExecutionError(f"artifact {request.artifact_dir}: {exc}", reason=c.REASON_RESTORE_FAILED) from exc
        try:
            result = engine.restore(request.artifact_dir, options)
        except engine.CompatibilityError as exc:
            raise IncompatibleError(exc.gate, str(exc)) from exc
        except engine.ArtifactError as exc:
            raise unusable(exc) from exc
        except engine.EngineError as exc:
            raise ExecutionError(str(exc), reason=c.REASON_RESTORE_FAILED) from exc
        return RestoreResult(pids=result.pids or (result.pid,), timings_ms=dict(result.timings_ms))

    def recover_captures(self) -> list[CaptureRecovered]:
        """Every journal record left in `journal_dir`: its source recovered by the engine, the record removed.
        UnsafeStateDir when the directory is not this agent's own (then nothing in it is read)."""
        from podsnap import engine

        if self.journal_dir is None:
            return []
        journal = private_dir(self.journal_dir)
        found: list[CaptureRecovered] = []
        for path in sorted(journal.glob("*.json")):
            # one bad record (a malformed file, a driver that raises) must neither stop the agent from
            # starting nor be tried again at every start: it is reported and removed
            try:
                if not stat.S_ISREG(path.lstat().st_mode):
                    raise ValueError("not a regular file")  # a symlink: never followed
                record = engine.read_capture_journal(path)
                recovery = engine.recover_capture(record, cuda=self.cuda)
            except Exception as exc:
                found.append(CaptureRecovered(path.stem, "unknown", False, f"journal record not recovered: {exc}"))
            else:
                found.append(
                    CaptureRecovered(
                        content=record.note.get("content") or path.stem,
                        step=record.step,
                        source_alive=recovery.source_alive,
                        summary=recovery.summary(),
                        problems=recovery.problems,
                    )
                )
            finally:
                path.unlink(missing_ok=True)
        for tmp in journal.glob(".*.tmp"):  # a write that died before its rename
            tmp.unlink(missing_ok=True)
        return found

    def check(self, artifact_dir: Path, expected_digest: str) -> None:
        """Cheap: the manifest against its recorded digest, then every listed file's type and size (no hashing)."""
        from podsnap import engine

        try:
            manifest = engine.read_manifest(artifact_dir, expected_digest=expected_digest or None)
            engine.verify(artifact_dir, manifest, deferred=[f.path for f in manifest.files])
        except engine.ArtifactError as exc:
            raise unusable(exc) from exc
        except ValueError as exc:
            raise ArtifactUnusable(str(exc)) from exc

    def remove(self, artifact_dir: Path) -> None:
        from podsnap import engine

        engine.remove_artifact(artifact_dir)

    def artifact_files(self, artifact: Path, digest: str) -> list[tuple[str, int]]:
        from podsnap import engine

        try:
            manifest = engine.read_manifest(artifact, expected_digest=digest)
            own = (artifact / engine.MANIFEST_NAME).lstat().st_size
        except engine.ArtifactError as exc:
            raise unusable(exc) from exc
        except (engine.EngineError, OSError, ValueError) as exc:
            raise ArtifactUnusable(str(exc)) from exc
        return [(engine.MANIFEST_NAME, own), *((f.path, f.size) for f in manifest.files)]

    def verify_artifact(self, artifact: Path, digest: str) -> int:
        from podsnap import engine

        try:
            manifest = engine.read_manifest(artifact, expected_digest=digest)
            return engine.verify(artifact, manifest) + (artifact / engine.MANIFEST_NAME).lstat().st_size
        except engine.ArtifactError as exc:
            raise unusable(exc) from exc
        except (engine.EngineError, OSError, ValueError) as exc:
            raise ArtifactUnusable(str(exc)) from exc
