"""The restore workflow, as phases sharing one Rollback:

    read_manifest -> verify -> compat -> before_restore -> criu_restore ->
    [fill -> resume: schema 2 only] -> cuda_restore -> cuda_unlock

A schema-2 artifact keeps its bulk memory outside CRIU's images (see _bulk): CRIU restores the rest and
leaves the tree stopped, `fill` writes the bulk in parallel while checking each chunk's digest (so those
files skip `verify`), and `resume` lets the tree run. With `verified_digests` the caller vouches for every
file's digest (a node-local copy checked when cached): `verify` checks types and sizes only and `fill`
hashes nothing. Nothing runs before the artifact is verified and
the gates passed; from the moment CRIU starts, any failure (or interruption) kills every process
restored so far, so no half-restored worker serves and none is left behind.

CRIU (root, every capability) obeys its images: a creds or core image swapped in on the volume after it
was verified would restore a process with forged credentials. So CRIU never reads the artifact: `verify`
copies every image under criu/ into a private dir (0700, in the system temp dir: node-local), hashing the
bytes as it writes them, and CRIU is pointed at that copy. After the fast restore's cut what is left
there is small (a few MiB: the bulk is read once by `fill` into private buffers, hashed as it is
written). A schema-1 artifact keeps all memory in its pages images and is copied too, whatever its size
(the copy costs a local write of bytes verify reads anyway; refusing would strand every artifact written
before the fast restore). With `verified_digests` the images are read in place: that copy is already the
agent's own, on node-local storage, verified when it was made.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from podsnap.engine import _artifact as art
from podsnap.engine import _bulk as bulk
from podsnap.engine import _compat as compat
from podsnap.engine import _criu_runner as runner_mod
from podsnap.engine import _nsenter as nsenter
from podsnap.engine import _proctree as proctree
from podsnap.engine._artifact import default_workers
from podsnap.engine._compat import GateFailure
from podsnap.engine._criu_binary import find_binary
from podsnap.engine._criu_config import inherit_line
from podsnap.engine._criu_runner import Criu
from podsnap.engine._cuda import CudaCheckpointer, default_checkpointer
from podsnap.engine._host import HostFacts, host_facts
from podsnap.engine._manifest import CRIU_DIR, MANIFEST_NAME, Manifest
from podsnap.engine._options import ProgressFn, RestoreOptions, RestoreResult, Timer
from podsnap.engine._rollback import Rollback
from podsnap.engine.errors import ArtifactError, EngineError, RestoreError


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


@dataclass(frozen=True)
class _Run:
    """One restore: what every phase reads, and the Rollback they share."""

    artifact: Path
    manifest: Manifest
    opts: RestoreOptions
    timer: Timer
    rb: Rollback
    #: the private copy of CRIU's images that `verify` fills and CRIU reads; None: read them in place
    #: (verified_digests)
    copy: Path | None = None

    @property
    def images(self) -> Path:
        """Where CRIU reads its images."""
        return self.copy if self.copy is not None else self.artifact / CRIU_DIR


@dataclass(frozen=True)
class _Restored:
    """The tree CRIU brought back: its root (namespace and host PID) and manifest pid -> host pid."""

    root_ns: int
    root_host: int
    hosts: dict[int, int]


def _load(artifact: Path, opts: RestoreOptions, timer: Timer) -> Manifest:
    with timer.phase("read_manifest"):
        manifest = art.read_manifest(artifact, expected_digest=opts.expected_manifest_digest)
    if manifest.namespaced != (opts.namespace_pid is not None):
        want = "inside a destination's namespaces (namespace_pid)" if manifest.namespaced else "on the host"
        raise RestoreError(
            f"{artifact} was captured {'in' if manifest.namespaced else 'out of'} a namespace: restore it {want}",
            phase="validate",
        )
    if opts.namespace_pid is not None:
        try:  # before anything runs: the placeholder is what it was, and its namespaces are the host's
            nsenter.check(opts.namespace_pid, opts.namespace_start)
        except nsenter.Refused as exc:
            raise RestoreError(f"refused namespace_pid {opts.namespace_pid}: {exc}", phase="validate") from exc
    return manifest


def _verify(run: _Run) -> int:
    timer = run.timer
    with timer.phase("verify", run.manifest.total_bytes) as start:
        nbytes = art.verify(
            run.artifact,
            run.manifest,
            workers=run.opts.hash_workers,
            progress=lambda done, total: timer.report("verify", done, total, start=start),
            deferred=run.manifest.bulk_files,  # checked chunk by chunk as `fill` reads them
            digests=not run.opts.verified_digests,
            copy_to=run.copy,
        )
        timer.set_done("verify", nbytes)
        return nbytes


@contextlib.contextmanager
def _private_images(opts: RestoreOptions) -> Iterator[Path | None]:
    """A fresh private dir for the copy of CRIU's images, removed afterwards; None with verified_digests."""
    if opts.verified_digests:
        yield None
        return
    path = Path(tempfile.mkdtemp(prefix="podsnap-images-"))  # mode 0700
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _gates(run: _Run) -> tuple[HostFacts, list[GateFailure]]:
    manifest, opts = run.manifest, run.opts
    with run.timer.phase("compat"):
        host = host_facts(with_gpus=bool(manifest.cuda_pids))
        skipped = compat.enforce(manifest, host, skip=opts.skip_compat, memory_limit_bytes=opts.memory_limit_bytes)
        busy = [p.ns_pid for p in manifest.processes if _pid_taken(p.ns_pid, opts.namespace_pid)]
        if busy:
            where = f"the PID namespace of {opts.namespace_pid}" if opts.namespace_pid is not None else "this host"
            raise RestoreError(
                f"pid(s) {busy} already in use in {where}: the source still runs, or its zombie is not reaped",
                phase="compat",
            )
    return host, skipped


def _before_restore(run: _Run) -> None:
    if run.opts.before_restore is None:
        return
    with run.timer.phase("before_restore"):
        try:
            run.opts.before_restore(run.artifact, run.manifest)
        except Exception as exc:
            raise RestoreError(f"before_restore hook: {exc}", phase="before_restore") from exc


def _cuda_for(manifest: Manifest, cuda: CudaCheckpointer | None) -> CudaCheckpointer | None:
    if not manifest.cuda_pids:
        return None
    cp = cuda or default_checkpointer()
    if not cp.available():
        raise RestoreError("the artifact holds CUDA state but this host cannot restore it", phase="compat")
    return cp


def _stdio_inherit(run: _Run) -> dict[int, str]:
    """In a pod, the worker's stdio were its old container's log pipes: open the new container's."""
    recorded = run.manifest.extra.get(proctree.STDIO_KEY)
    if run.opts.namespace_pid is None or not isinstance(recorded, dict):
        return {}
    stdio = {str(k): str(v) for k, v in recorded.items()}
    where = str(run.artifact / MANIFEST_NAME)
    for fd, key in stdio.items():
        # these reach CRIU's config file: only fds 0-2 and pipe ids, never a smuggled option
        if fd not in {"0", "1", "2"}:
            raise ArtifactError(f"{where}: extra.{proctree.STDIO_KEY} names fd {fd!r}, not 0, 1 or 2", path=where)
        try:
            inherit_line(int(fd), key)
        except ValueError as exc:
            raise ArtifactError(f"{where}: extra.{proctree.STDIO_KEY}.{fd}: {exc}", path=where) from exc
    try:
        return proctree.open_stdio_like(run.opts.namespace_pid, stdio)
    except OSError as exc:
        raise RestoreError(f"cannot open the placeholder's stdio: {exc}", phase="criu_restore") from exc


def _criu_restore(run: _Run, runner: Criu) -> _Restored:
    manifest, opts, timer = run.manifest, run.opts, run.timer
    pages = manifest.criu_pages_bytes
    with timer.phase("criu_restore", pages) as start:

        def monitor(criu_pid: int) -> None:
            timer.report("criu_restore", min(proctree.bytes_read(criu_pid), pages), pages, start=start)

        inherit = _stdio_inherit(run)
        try:
            with runner_mod.work_dir("restore", explicit=opts.work_dir, log_dir=opts.log_dir) as work:
                root_ns = runner.restore(
                    run.images,
                    work,
                    opts.criu,
                    namespace_pid=opts.namespace_pid,
                    namespace_start=opts.namespace_start,
                    join_cgroups=opts.join_cgroups,
                    cgroup_root=opts.cgroup_root,
                    net_ns=opts.net_ns,
                    inherit=inherit,
                    leave_stopped=bool(manifest.bulk),  # filled, then resumed, by the phases below
                    monitor=monitor,
                )
        finally:
            for fd in inherit:
                os.close(fd)
        hosts: dict[int, int] = {}
        for proc in manifest.processes:
            found = _host_pid(proc.ns_pid, opts.namespace_pid)
            if found is not None:
                hosts[proc.pid] = found
                run.rb.restored.append(found)
        root_host = _host_pid(root_ns, opts.namespace_pid)
        if root_host is None:
            raise RestoreError(f"CRIU reported pid {root_ns} but no such process is alive", phase="criu_restore")
    return _Restored(root_ns=root_ns, root_host=root_host, hosts=hosts)


def _fill(run: _Run, tree: _Restored) -> None:
    """Write the bulk memory into the stopped tree, many threads at once, each chunk digest-checked."""
    manifest, timer = run.manifest, run.timer
    with timer.phase("fill", manifest.bulk_bytes) as start:
        by_criu_pid = {p.ns_pid: tree.hosts[p.pid] for p in manifest.processes if p.pid in tree.hosts}
        lost = sorted({e.pid for e in manifest.bulk} - by_criu_pid.keys())
        if lost:
            raise RestoreError(f"process(es) {lost} of the bulk memory were not restored", phase="fill")
        running = proctree.wait_stopped(list(tree.hosts.values()))
        if running:
            raise RestoreError(f"pid(s) {running} run although CRIU was told to leave them stopped", phase="fill")
        written = bulk.fill(
            run.artifact,
            manifest.bulk,
            {f.path: f for f in manifest.files},
            by_criu_pid,
            workers=run.opts.fill_workers or default_workers(),
            progress=lambda done, total: timer.report("fill", done, total, start=start),
            verified=run.opts.verified_digests,
            algorithm=manifest.digest,
        )
        timer.set_done("fill", written)
    with timer.phase("resume"):
        stopped = proctree.resume(list(tree.hosts.values()))
        if stopped:
            raise RestoreError(f"pid(s) {stopped} stay stopped after SIGCONT", phase="resume")


def _restore_cuda(run: _Run, tree: _Restored, cp: CudaCheckpointer | None, host: HostFacts) -> list[int]:
    """The driver's restore (it needs the process running), then unlock: the worker may use its GPU again."""
    manifest, timer = run.manifest, run.timer
    cuda_new = [tree.hosts[p] for p in manifest.cuda_pids if p in tree.hosts]
    if cp is None:
        return cuda_new
    if len(cuda_new) != len(manifest.cuda_pids):
        raise RestoreError(f"CUDA processes {list(manifest.cuda_pids)} not all restored", phase="criu_restore")
    pairs = gpu_pairs(manifest, host, run.opts.gpu_map)
    with timer.phase("cuda_restore"):
        for host_pid in cuda_new:
            cp.restore(host_pid, pairs)
    with timer.phase("cuda_unlock"):
        for host_pid in cuda_new:
            cp.unlock(host_pid)
    return cuda_new


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
    manifest = _load(artifact, opts, timer)
    with _private_images(opts) as copy:
        return _restore(_Run(artifact, manifest, opts, timer, Rollback(), copy), cuda, criu)


def _restore(run: _Run, cuda: CudaCheckpointer | None, criu: Criu | None) -> RestoreResult:
    manifest, opts, timer = run.manifest, run.opts, run.timer
    _verify(run)
    host, skipped = _gates(run)
    _before_restore(run)
    cp = _cuda_for(manifest, cuda)
    runner = criu or Criu(find_binary(opts.criu_binary))
    try:
        tree = _criu_restore(run, runner)
        if manifest.bulk:
            _fill(run, tree)
        cuda_new = _restore_cuda(run, tree, cp, host)
        restored, run.rb.restored = tuple(run.rb.restored), []
        return RestoreResult(
            pid=tree.root_host,
            ns_pid=tree.root_ns,
            pids=restored,
            manifest=manifest,
            timings_ms=timer.finish(),
            bytes_total=manifest.total_bytes,
            cuda_pids=tuple(cuda_new),
            skipped_gates=tuple(skipped),
            phase_bytes=dict(timer.bytes),
        )
    except BaseException as exc:
        # never leave a half-restored process serving, even when interrupted
        # (a failed CRIU restore has already killed its partial tree itself)
        run.rb.undo()
        if isinstance(exc, RestoreError | ArtifactError) or not isinstance(exc, EngineError | OSError):
            raise
        raise RestoreError(str(exc), phase=timer.current, log_path=getattr(exc, "log_path", None)) from exc
