"""The restore workflow: verify digests -> gates -> CRIU restore (pidfile) -> CUDA restore + unlock."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from podsnap.engine import artifact as art
from podsnap.engine import compat, proctree
from podsnap.engine.criu import Criu, bytes_read, find_binary
from podsnap.engine.cuda import CudaCheckpointer, default_checkpointer
from podsnap.engine.errors import EngineError, RestoreError
from podsnap.engine.host import HostFacts, host_facts
from podsnap.engine.manifest import CRIU_DIR, Manifest
from podsnap.engine.options import ProgressFn, RestoreOptions, RestoreResult, Timer


def gpu_pairs(manifest: Manifest, host: HostFacts, gpu_map: Mapping[str, str] | None) -> list[tuple[str, str]]:
    """(old, new) GPU UUIDs for the CUDA restore; empty when the source's GPUs are all here."""
    used = list(manifest.cuda_gpu_uuids) or [g.uuid for g in manifest.source.gpus]
    if gpu_map is not None:
        return [(old, gpu_map.get(old, old)) for old in used]
    here = [g.uuid for g in host.gpus]
    if all(u in here for u in used):
        return []
    order = {g.uuid: g.index for g in manifest.source.gpus}
    used.sort(key=lambda u: order.get(u, 0))
    return list(zip(used, here[: len(used)], strict=False))


def _host_pid(ns_pid: int, namespace_pid: int | None) -> int | None:
    if namespace_pid is None:
        return ns_pid if proctree.is_alive(ns_pid) else None
    return proctree.host_pid_in_ns(ns_pid, namespace_pid)


def _pid_taken(ns_pid: int, namespace_pid: int | None) -> bool:
    if namespace_pid is None:
        return proctree.exists(ns_pid)
    return proctree.host_pid_in_ns(ns_pid, namespace_pid) is not None


def restore(
    artifact: Path | str,
    options: RestoreOptions | None = None,
    *,
    cuda: CudaCheckpointer | None = None,
    criu: Criu | None = None,
    progress: ProgressFn | None = None,
) -> RestoreResult:
    """Restore the process tree captured in `artifact`; return the new root's host PID and timings.

    Raises ArtifactError (tampered/truncated/missing), CompatibilityError (a gate refused this host),
    RestoreError (CRIU or CUDA failed: whatever was restored has been killed).
    """
    opts = options or RestoreOptions()
    artifact = Path(artifact).absolute()
    timer = Timer(progress)
    with timer.phase("read_manifest"):
        manifest = art.read_manifest(artifact)
    namespaced = opts.namespace_pid is not None
    if manifest.namespaced != namespaced:
        want = "inside a destination's namespaces (namespace_pid)" if manifest.namespaced else "on the host"
        raise RestoreError(
            f"{artifact} was captured {'in' if manifest.namespaced else 'out of'} a namespace: restore it {want}",
            phase="validate",
        )
    with timer.phase("verify", manifest.total_bytes) as start:
        nbytes = art.verify(
            artifact,
            manifest,
            workers=opts.hash_workers,
            progress=lambda done, total: timer.report("verify", done, total, start=start),
        )
    with timer.phase("compat"):
        host = host_facts(with_gpus=bool(manifest.cuda_pids))
        skipped = compat.enforce(manifest, host, skip=opts.skip_compat, memory_limit_bytes=opts.memory_limit_bytes)
        busy = [p.ns_pid for p in manifest.processes if _pid_taken(p.ns_pid, opts.namespace_pid)]
        if busy:
            where = f"the PID namespace of {opts.namespace_pid}" if namespaced else "this host"
            raise RestoreError(
                f"pid(s) {busy} already in use in {where}: the source still runs, or its zombie is not reaped",
                phase="compat",
            )
    if opts.before_restore is not None:
        with timer.phase("before_restore"):
            try:
                opts.before_restore(artifact, manifest)
            except Exception as exc:
                raise RestoreError(f"before_restore hook: {exc}", phase="before_restore") from exc
    cp: CudaCheckpointer | None = None
    if manifest.cuda_pids:
        cp = cuda or default_checkpointer()
        if not cp.available():
            raise RestoreError("the artifact holds CUDA state but this host cannot restore it", phase="compat")
    runner = criu or Criu(find_binary(opts.criu_binary))
    work = opts.work_dir or Path(tempfile.mkdtemp(prefix="podsnap-restore-"))
    restored: list[int] = []
    phase = "criu_restore"
    try:
        with timer.phase(phase, manifest.memory_bytes) as start:

            def monitor(criu_pid: int) -> None:
                timer.report(
                    phase, min(bytes_read(criu_pid), manifest.memory_bytes), manifest.memory_bytes, start=start
                )

            # in a pod, the worker's stdio were its old container's log pipes: give it the new container's
            inherit: dict[int, str] = {}
            recorded = manifest.extra.get(proctree.STDIO_KEY)
            if opts.namespace_pid is not None and isinstance(recorded, dict):
                try:
                    inherit = proctree.open_stdio_like(
                        opts.namespace_pid, {str(k): str(v) for k, v in recorded.items()}
                    )
                except OSError as exc:
                    raise RestoreError(f"cannot open the placeholder's stdio: {exc}", phase=phase) from exc
            try:
                root_ns = runner.restore(
                    artifact / CRIU_DIR,
                    work,
                    opts.criu,
                    namespace_pid=opts.namespace_pid,
                    join_cgroups=opts.join_cgroups,
                    net_ns=opts.net_ns,
                    inherit=inherit,
                    monitor=monitor,
                )
            finally:
                for fd in inherit:
                    os.close(fd)
            mapping: dict[int, int] = {}
            for proc in manifest.processes:
                found = _host_pid(proc.ns_pid, opts.namespace_pid)
                if found is not None:
                    mapping[proc.pid] = found
                    restored.append(found)
            root_host = _host_pid(root_ns, opts.namespace_pid)
            if root_host is None:
                raise RestoreError(f"CRIU reported pid {root_ns} but no such process is alive", phase=phase)
        cuda_new = [mapping[p] for p in manifest.cuda_pids if p in mapping]
        if cp is not None:
            if len(cuda_new) != len(manifest.cuda_pids):
                raise RestoreError(f"CUDA processes {list(manifest.cuda_pids)} not all restored", phase=phase)
            pairs = gpu_pairs(manifest, host, opts.gpu_map)
            phase = "cuda_restore"
            with timer.phase(phase):
                for host_pid in cuda_new:
                    cp.restore(host_pid, pairs)
            phase = "cuda_unlock"
            with timer.phase(phase):
                for host_pid in cuda_new:
                    cp.unlock(host_pid)
        return RestoreResult(
            pid=root_host,
            ns_pid=root_ns,
            pids=tuple(restored),
            manifest=manifest,
            timings_ms=timer.finish(),
            bytes_total=nbytes,
            cuda_pids=tuple(cuda_new),
            skipped_gates=tuple(skipped),
        )
    except BaseException as exc:
        # never leave a half-restored process serving, even when interrupted
        # (a failed CRIU restore has already killed its partial tree itself)
        proctree.kill_tree(restored)
        if isinstance(exc, RestoreError) or not isinstance(exc, EngineError | OSError):
            raise
        raise RestoreError(str(exc), phase=phase) from exc
    finally:
        # a failure's CRIU log tail is already in the error; pass work_dir to keep the whole log
        if opts.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
