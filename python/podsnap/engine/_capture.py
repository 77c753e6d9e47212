"""The capture workflow, as phases sharing one Rollback:

    inspect -> cuda_lock -> cuda_checkpoint -> criu_dump (its pages images hashed as CRIU writes them,
    see _prehash) -> (resume the source, with leave_running) -> cut (bulk memory out of CRIU's images,
    see _bulk) -> before_publish -> hash (the rest) -> reap -> publish

Until the dump succeeded, a failure gives the source its CUDA state back so it keeps serving; at any
point it discards the staging dir. Nothing half-written is ever visible at `out`. With
`options.journal`, each step from the CUDA lock on is recorded before it begins (see _journal), so a
capture whose process dies gets its source recovered by whoever finds the record.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podsnap.engine import _artifact as art
from podsnap.engine import _bulk as bulk
from podsnap.engine import _criu_runner as runner_mod
from podsnap.engine import _journal as journal_mod
from podsnap.engine import _nsenter as nsenter
from podsnap.engine import _proctree as proctree
from podsnap.engine._criu_binary import find_binary
from podsnap.engine._criu_images import ImageError
from podsnap.engine._criu_runner import Criu
from podsnap.engine._cuda import CudaCheckpointer, default_checkpointer
from podsnap.engine._host import HostFacts, host_facts
from podsnap.engine._manifest import CRIU_DIR, Extent, Manifest
from podsnap.engine._options import CaptureOptions, CaptureResult, ProgressFn, Timer
from podsnap.engine._prehash import Prehash
from podsnap.engine._proctree import STDIO_KEY, ProcInfo
from podsnap.engine._rollback import Rollback
from podsnap.engine.errors import CaptureError, CriuError, EngineError


@dataclass(frozen=True)
class _Source:
    """What `inspect` found out about the tree to capture."""

    pid: int
    tree: list[ProcInfo]
    #: the root's PID as CRIU sees it (inside the pod's PID namespace in namespace mode)
    criu_pid: int
    #: the root's stdio pipes, recorded so a restore in a pod can hand over the new container's
    stdio: dict[str, str]
    cuda_map: dict[int, list[str]]
    facts: HostFacts
    runner: Criu
    criu_version: str


def _dir_bytes(path: Path) -> int:
    total = 0
    for p in path.rglob("*"):
        with contextlib.suppress(OSError):
            total += p.stat().st_size
    return total


def _refuse(message: str, phase: str = "inspect") -> CaptureError:
    return CaptureError(message, phase=phase, source_alive=True)


def _inspect(pid: int, opts: CaptureOptions, cuda: CudaCheckpointer | None, criu: Criu | None, rb: Rollback) -> _Source:
    try:
        tree = proctree.tree(pid)
    except ProcessLookupError as exc:
        raise CaptureError(f"no process with pid {pid}", phase="inspect", source_alive=False) from exc
    try:
        json.dumps(dict(opts.extra))
    except (TypeError, ValueError) as exc:
        raise _refuse(f"options.extra must be JSON-serializable: {exc}") from exc
    criu_pid, stdio = pid, {}
    if opts.namespace_pid is not None:
        try:
            # the namespaces CRIU will enter are checked again right before it runs (_criu_runner); the tree's
            # own user namespaces only here: what CRIU resolves goes through the namespaces it entered
            nsenter.check(opts.namespace_pid, opts.namespace_start, tree=[p.pid for p in tree])
        except nsenter.Refused as exc:
            raise _refuse(f"refused namespace_pid {opts.namespace_pid}: {exc}") from exc
        if proctree.pid_ns(pid) != proctree.pid_ns(opts.namespace_pid):
            raise _refuse(f"pid {pid} is not in the PID namespace of namespace_pid {opts.namespace_pid}")
        if tree[0].ns_pid == 1:
            raise _refuse(
                f"pid {pid} is PID 1 of its namespace: that PID is never free in a destination pod; "
                "run the worker under an init (shareProcessNamespace, or podsnap-run)"
            )
        criu_pid = tree[0].ns_pid
        # the container's stdio are pipes to its runtime's log shim; remember them so a restore can
        # hand the new container's pipes in their place (else the worker writes into a dead pipe)
        stdio = proctree.stdio_pipes(pid)
    uring = proctree.io_uring_users([p.pid for p in tree])
    if uring:
        raise _refuse(
            f"pid(s) {uring} use io_uring, which CRIU cannot checkpoint: keep the worker off io_uring "
            "(sysctl kernel.io_uring_disabled=2 makes libraries fall back)"
        )
    runner = criu or Criu(find_binary(opts.criu_binary))
    criu_version = runner.version()
    if opts.cuda != "off" and rb.cuda is None:
        rb.cuda = cuda or default_checkpointer()
    cuda_map = rb.cuda.cuda_pids(p.pid for p in tree) if rb.cuda is not None else {}
    if opts.cuda == "on" and not cuda_map:
        raise _refuse(f"cuda='on' but no process in the tree of {pid} holds CUDA state")
    return _Source(
        pid=pid,
        tree=tree,
        criu_pid=criu_pid,
        stdio=stdio,
        cuda_map=cuda_map,
        facts=host_facts(with_gpus=bool(cuda_map)),
        runner=runner,
        criu_version=criu_version,
    )


def _checkpoint_cuda(
    src: _Source, opts: CaptureOptions, timer: Timer, rb: Rollback, journal: journal_mod.Journal
) -> None:
    """Lock every CUDA process, then checkpoint it: its GPU memory moves into its host memory. The journal
    says which step begins before it begins, so a capture that dies in it is recovered."""
    if not src.cuda_map:
        return
    assert rb.cuda is not None
    journal.step(journal_mod.STEP_CUDA_LOCK)
    with timer.phase("cuda_lock"):
        for p in src.cuda_map:
            rb.cuda.lock(p, opts.cuda_lock_timeout_ms)
            rb.locked.append(p)
    journal.step(journal_mod.STEP_CUDA_CHECKPOINT)
    with timer.phase("cuda_checkpoint"):
        for p in src.cuda_map:
            rb.cuda.checkpoint(p)
            rb.checkpointed.append(p)


def _dump(
    src: _Source, opts: CaptureOptions, staging: art.Staging, timer: Timer, rb: Rollback
) -> tuple[list[str], dict[str, tuple[int, list[str]]]]:
    """CRIU dump into the staging dir; its log goes into the artifact's logs/. Returns CRIU's config lines
    and the digests of its pages images, taken on other cores while CRIU wrote them (see _prehash)."""
    estimate = proctree.rss_bytes([p.pid for p in src.tree])  # GPU memory included, once checkpointed
    with (
        timer.phase("criu_dump", estimate) as start,
        runner_mod.work_dir("dump", log_dir=opts.log_dir) as work,
        Prehash(staging.criu_dir, workers=opts.hash_workers or art.default_workers(), algorithm=opts.digest) as prehash,
    ):
        net_inode = Path(f"/proc/{src.pid}/ns/net").stat().st_ino if opts.criu.external_net_ns else None

        def monitor(_: int) -> None:
            timer.report("criu_dump", _dir_bytes(staging.criu_dir), estimate, start=start)

        lines = src.runner.dump(
            src.criu_pid,
            staging.criu_dir,
            work,
            opts.criu,
            namespace_pid=opts.namespace_pid,
            namespace_start=opts.namespace_start,
            leave_running=opts.leave_running,
            net_ns_inode=net_inode,
            monitor=monitor,
        )
        prehashed = {f"{CRIU_DIR}/{name}": digests for name, digests in prehash.finish().items()}
        # the rest of CRIU's images (small) hashed now, before anyone else can have rewritten them on the
        # volume for long: those digests are binding (`describe_files`), a later change is refused
        rest = [f"{CRIU_DIR}/{p.name}" for p in sorted(staging.criu_dir.iterdir())]
        prehashed |= art.hash_files(
            staging.path,
            [rel for rel in rest if rel not in prehashed],
            workers=opts.hash_workers,
            algorithm=opts.digest,
        )
        timer.set_done("criu_dump", _dir_bytes(staging.criu_dir))
        (staging.path / "logs").mkdir()
        with contextlib.suppress(OSError):
            shutil.copyfile(work / "dump.log", staging.path / "logs" / "dump.log")
    if not opts.leave_running:
        rb.forget_cuda()  # the source is gone; its CUDA state is in the image now
    return lines, prehashed


def _resume_source(opts: CaptureOptions, rb: Rollback) -> None:
    """With leave_running: the source still runs; give it its CUDA state back right away."""
    if opts.leave_running:
        problems = rb.resume_cuda()
        if problems:
            raise CaptureError("; ".join(problems), phase="cuda_resume", source_alive=True)


def _reap(src: _Source, opts: CaptureOptions, timer: Timer) -> None:
    """Without leave_running CRIU killed the tree: its PIDs are free for a restore only once its parent
    reaped it. The kernel tears the dead tree down while cut and hash run, so this waits last."""
    if opts.leave_running:
        return
    with timer.phase("reap"):
        for proc in src.tree:
            proctree.wait_gone(proc.pid, timeout_s=30)


def _cut(
    src: _Source, opts: CaptureOptions, staging: art.Staging, timer: Timer
) -> tuple[bulk.Cut, dict[str, tuple[int, list[str]]]]:
    """The fast restore's half at capture: large memory runs leave CRIU's images for raw bulk files.
    Also returns the digests of the images the cut wrote anew, taken right after it wrote them."""
    if not opts.fast_restore:
        return bulk.Cut([], 0), {}
    with timer.phase("cut"):
        try:
            done = bulk.cut(
                staging.path,
                {p.ns_pid for p in src.tree},
                min_run=opts.bulk_min_run_bytes,
                hugepages=opts.bulk_hugepages,
            )
        except ImageError as exc:
            raise CaptureError(
                f"CRIU {src.criu_version} wrote images this podsnap cannot split ({exc}): "
                "capture with fast_restore=False",
                phase="cut",
                source_alive=proctree.is_alive(src.pid),
            ) from exc
        # binding like the dump's (`describe_files`): what the cut wrote is not left to the hash phase,
        # after before_publish, for a writer of the volume to change first
        rewritten = art.hash_files(
            staging.path, sorted(done.rewritten), workers=opts.hash_workers, algorithm=opts.digest
        )
        # its last report: bytes moved of all large runs (the rest is in mappings a write cannot fill)
        timer.set_done("cut", sum(e.length for e in done.extents), total=done.large_bytes)
    if done.advised_bytes:
        timer.bytes["hugepages"] = done.advised_bytes
    return done, rewritten


def _extra_sections(src: _Source, opts: CaptureOptions, staging: art.Staging, timer: Timer) -> dict[str, Any]:
    extra = dict(opts.extra)
    if src.stdio:
        extra[STDIO_KEY] = src.stdio
    if opts.before_publish is not None:
        with timer.phase("before_publish"):
            try:
                extra.update(opts.before_publish(staging.path))
            except Exception as exc:
                raise CaptureError(f"before_publish hook: {exc}", phase="before_publish", source_alive=False) from exc
    return extra


def _hash(
    staging: art.Staging, opts: CaptureOptions, timer: Timer, known: dict[str, tuple[int, list[str]]]
) -> tuple[art.FileEntry, ...]:
    """Digest every file; `known` ones (hashed during the dump, unchanged since) are taken as they are."""
    total = _dir_bytes(staging.path)
    with timer.phase("hash", total) as start:
        files = art.describe_files(
            staging.path,
            workers=opts.hash_workers,
            progress=lambda done, total: timer.report("hash", done, total, start=start),
            known=known,
            algorithm=opts.digest,
        )
        # what this phase itself read (the rest was hashed while CRIU wrote it)
        sizes = {f.path: f.size for f in files}
        timer.set_done("hash", total - sum(size for rel, (size, _) in known.items() if sizes.get(rel) == size))
        return files


def _publish(
    src: _Source,
    opts: CaptureOptions,
    staging: art.Staging,
    timer: Timer,
    *,
    files: tuple[art.FileEntry, ...],
    lines: list[str],
    extra: dict[str, Any],
    extents: tuple[Extent, ...],
) -> tuple[Manifest, Path]:
    with timer.phase("publish"):
        manifest = Manifest(
            source=src.facts,
            processes=tuple(src.tree),
            cuda_pids=tuple(src.cuda_map),
            cuda_gpu_uuids=tuple(sorted({u for us in src.cuda_map.values() for u in us})),
            files=files,
            namespaced=opts.namespace_pid is not None,
            criu_version=src.criu_version,
            criu_options=tuple(lines),
            timings_ms={k: round(v, 3) for k, v in timer.timings.items()},
            extra=json.loads(json.dumps(extra)),
            created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            bulk=extents,
            digest=opts.digest,
        )
        staging.write_manifest(manifest)
        return manifest, staging.publish()


def capture(
    pid: int,
    out: Path | str,
    options: CaptureOptions | None = None,
    *,
    cuda: CudaCheckpointer | None = None,
    criu: Criu | None = None,
    progress: ProgressFn | None = None,
) -> CaptureResult:
    """Checkpoint the process tree rooted at host PID `pid` into the artifact directory `out`.

    `out` must not exist; it appears only complete (staged next to it, fsynced, renamed). CRIU's dump
    ends the source (unless `options.leave_running`). If anything fails before the dump succeeded,
    the source's CUDA state is restored and unlocked so it keeps serving, the staging dir is removed,
    and CaptureError is raised with the cause chained.
    """
    opts = options or CaptureOptions()
    timer = Timer(progress)
    rb = Rollback(cuda if opts.cuda != "off" else None)
    journal = journal_mod.Journal(opts.journal, opts.journal_note)
    try:
        with timer.phase("inspect"):
            src = _inspect(pid, opts, cuda, criu, rb)
            staging = rb.staging = art.Staging(Path(out))
            # durable before anything touches the source: a capture that dies from here on is recovered
            journal.begin(pid, [p.pid for p in src.tree], src.cuda_map, leave_running=opts.leave_running)
        _checkpoint_cuda(src, opts, timer, rb, journal)
        journal.step(journal_mod.STEP_CRIU_DUMP)
        lines, prehashed = _dump(src, opts, staging, timer, rb)
        journal.step(journal_mod.STEP_DUMPED)
        _resume_source(opts, rb)
        done, rewritten = _cut(src, opts, staging, timer)
        extents = tuple(done.extents)
        # a pages image the cut moved into bulk/ keeps its bytes, so its digests follow it; the images the
        # cut wrote anew have theirs from right after it wrote them
        moved = {rel: done.moved.get(rel, rel) for rel in prehashed}
        known = {moved[rel]: d for rel, d in prehashed.items() if moved[rel] not in done.rewritten} | rewritten
        extra = _extra_sections(src, opts, staging, timer)
        files = _hash(staging, opts, timer, known)
        _reap(src, opts, timer)
        manifest, published = _publish(
            src, opts, staging, timer, files=files, lines=lines, extra=extra, extents=extents
        )
        rb.staging = None
        journal.end()
        return CaptureResult(
            artifact=published,
            manifest=manifest,
            timings_ms=timer.finish(),
            bytes_total=manifest.total_bytes,
            bytes_memory=manifest.memory_bytes,
            cuda_pids=tuple(src.cuda_map),
            manifest_digest=art.manifest_digest(published),
            phase_bytes=dict(timer.bytes),
        )
    except BaseException as exc:
        problems = rb.undo()
        with contextlib.suppress(OSError):
            journal.end()  # rolled back: nothing left for a recovery to give back
        if isinstance(exc, CaptureError) or not isinstance(exc, EngineError | OSError):
            raise
        alive = proctree.is_alive(pid)
        note = f" (CUDA rollback problems: {'; '.join(problems)})" if problems else ""
        source = "the source keeps running" if alive else "the source is gone"
        full = no_space(exc)
        if full:
            note += " (the artifact volume is full: nothing of this capture was left on it)"
        raise CaptureError(
            f"{exc}{note}; {source}",
            phase=timer.current,
            source_alive=alive,
            log_path=getattr(exc, "log_path", None),
            no_space=full,
        ) from exc


#: what CRIU's log says where a write failed for want of room (strerror of ENOSPC and EDQUOT)
_NO_SPACE_TEXT = ("No space left on device", "Disk quota exceeded")


def no_space(exc: BaseException) -> bool:
    """Whether `exc` (or CRIU's log it names) says a write found the filesystem full."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    if isinstance(exc, CriuError):
        text = f"{exc}\n{exc.log_tail}"
        log = exc.log_path
        if log is not None:
            with contextlib.suppress(OSError):
                text += log.read_text(errors="replace")[-64 << 10 :]
        return any(t in text for t in _NO_SPACE_TEXT)
    return False
