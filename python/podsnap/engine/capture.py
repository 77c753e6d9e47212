"""The capture workflow: (CUDA lock -> checkpoint) -> CRIU dump -> manifest -> atomic publish."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import shutil
import tempfile
from pathlib import Path

from podsnap.engine import artifact as art
from podsnap.engine import proctree
from podsnap.engine.criu import Criu, find_binary
from podsnap.engine.cuda import CudaCheckpointer, default_checkpointer
from podsnap.engine.errors import CaptureError, CudaError, EngineError
from podsnap.engine.host import host_facts
from podsnap.engine.manifest import Manifest
from podsnap.engine.options import CaptureOptions, CaptureResult, ProgressFn, Timer
from podsnap.engine.proctree import STDIO_KEY


def _dir_bytes(path: Path) -> int:
    total = 0
    for p in path.rglob("*"):
        with contextlib.suppress(OSError):
            total += p.stat().st_size
    return total


def _rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total


def _rollback_cuda(cuda: CudaCheckpointer, locked: list[int], checkpointed: list[int]) -> list[str]:
    """Bring the source's CUDA state back (restore, then unlock); return what could not be undone."""
    problems = []
    for pid in reversed(checkpointed):
        try:
            cuda.restore(pid)
        except CudaError as exc:
            problems.append(str(exc))
    for pid in reversed(locked):
        try:
            cuda.unlock(pid)
        except CudaError as exc:
            problems.append(str(exc))
    return problems


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
    out = Path(out)
    timer = Timer(progress)
    locked: list[int] = []
    checkpointed: list[int] = []
    staging: art.Staging | None = None
    work = Path(tempfile.mkdtemp(prefix="podsnap-dump-"))
    phase = "inspect"
    dumped = False
    stdio: dict[str, str] = {}
    cp: CudaCheckpointer | None = cuda
    try:
        with timer.phase("inspect"):
            try:
                tree = proctree.tree(pid)
            except ProcessLookupError as exc:
                raise CaptureError(f"no process with pid {pid}", phase=phase, source_alive=False) from exc
            root = tree[0]
            criu_pid = pid
            try:
                json.dumps(dict(opts.extra))
            except (TypeError, ValueError) as exc:
                raise CaptureError(
                    f"options.extra must be JSON-serializable: {exc}", phase=phase, source_alive=True
                ) from exc
            if opts.namespace_pid is not None:
                if proctree.pid_ns(pid) != proctree.pid_ns(opts.namespace_pid):
                    raise CaptureError(
                        f"pid {pid} is not in the PID namespace of namespace_pid {opts.namespace_pid}",
                        phase=phase,
                        source_alive=True,
                    )
                if root.ns_pid == 1:
                    raise CaptureError(
                        f"pid {pid} is PID 1 of its namespace: that PID is never free in a destination pod; "
                        "run the worker under an init (shareProcessNamespace, or podsnap-run)",
                        phase=phase,
                        source_alive=True,
                    )
                criu_pid = root.ns_pid
                # the container's stdio are pipes to its runtime's log shim; remember them so a restore can
                # hand the new container's pipes in their place (else the worker writes into a dead pipe)
                stdio = proctree.stdio_pipes(pid)
            uring = proctree.io_uring_users([p.pid for p in tree])
            if uring:
                raise CaptureError(
                    f"pid(s) {uring} use io_uring, which CRIU cannot checkpoint: keep the worker off io_uring "
                    "(sysctl kernel.io_uring_disabled=2 makes libraries fall back)",
                    phase=phase,
                    source_alive=True,
                )
            runner = criu or Criu(find_binary(opts.criu_binary))
            criu_version = runner.version()
            if cp is None and opts.cuda != "off":
                cp = default_checkpointer()
            cuda_map = cp.cuda_pids(p.pid for p in tree) if cp is not None and opts.cuda != "off" else {}
            if opts.cuda == "on" and not cuda_map:
                raise CaptureError(
                    f"cuda='on' but no process in the tree of {pid} holds CUDA state", phase=phase, source_alive=True
                )
            facts = host_facts(with_gpus=bool(cuda_map))
            mem_estimate = _rss_bytes([p.pid for p in tree])
            staging = art.Staging(out)
        if cuda_map:
            assert cp is not None
            phase = "cuda_lock"
            with timer.phase(phase):
                for p in cuda_map:
                    cp.lock(p, opts.cuda_lock_timeout_ms)
                    locked.append(p)
            phase = "cuda_checkpoint"
            with timer.phase(phase):
                for p in cuda_map:
                    cp.checkpoint(p)
                    checkpointed.append(p)
            # GPU memory now lives in the process's host memory: that is what CRIU will write
            mem_estimate = _rss_bytes([p.pid for p in tree])
        phase = "criu_dump"
        net_inode = Path(f"/proc/{pid}/ns/net").stat().st_ino if opts.criu.external_net_ns else None
        with timer.phase(phase, mem_estimate) as start:
            images = staging.criu_dir

            def monitor(_: int) -> None:
                timer.report(phase, _dir_bytes(images), mem_estimate, start=start)

            lines = runner.dump(
                criu_pid,
                images,
                work,
                opts.criu,
                namespace_pid=opts.namespace_pid,
                leave_running=opts.leave_running,
                net_ns_inode=net_inode,
                monitor=monitor,
            )
            dumped = True
            timer.set_done(phase, _dir_bytes(images))
        if not opts.leave_running:
            # CRIU killed the tree; its PIDs are free for a restore only once the parent reaped them
            with timer.phase("reap"):
                for proc in tree:
                    proctree.wait_gone(proc.pid, timeout_s=30)
        if opts.leave_running and checkpointed:
            problems = _rollback_cuda(cp, locked, checkpointed) if cp is not None else []
            locked, checkpointed = [], []
            if problems:
                raise CaptureError("; ".join(problems), phase="cuda_resume", source_alive=True)
        (staging.path / "logs").mkdir()
        with contextlib.suppress(OSError):
            shutil.copyfile(work / "dump.log", staging.path / "logs" / "dump.log")
        extra = dict(opts.extra)
        if stdio:
            extra[STDIO_KEY] = stdio
        if opts.before_publish is not None:
            phase = "before_publish"
            with timer.phase(phase):
                try:
                    extra.update(opts.before_publish(staging.path))
                except Exception as exc:
                    raise CaptureError(f"before_publish hook: {exc}", phase=phase, source_alive=False) from exc
        phase = "hash"
        with timer.phase(phase, _dir_bytes(staging.path)) as start:
            files = art.describe_files(
                staging.path,
                workers=opts.hash_workers,
                progress=lambda done, total: timer.report("hash", done, total, start=start),
            )
        phase = "publish"
        with timer.phase(phase):
            timings = dict(timer.timings)
            manifest = Manifest(
                source=facts,
                processes=tuple(tree),
                cuda_pids=tuple(cuda_map),
                cuda_gpu_uuids=tuple(sorted({u for us in cuda_map.values() for u in us})),
                files=files,
                namespaced=opts.namespace_pid is not None,
                criu_version=criu_version,
                criu_options=tuple(lines),
                timings_ms={k: round(v, 3) for k, v in timings.items()},
                extra=json.loads(json.dumps(extra)),
                created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            )
            staging.write_manifest(manifest)
            published = staging.publish()
        return CaptureResult(
            artifact=published,
            manifest=manifest,
            timings_ms=timer.finish(),
            bytes_total=manifest.total_bytes,
            bytes_memory=manifest.memory_bytes,
            cuda_pids=tuple(cuda_map),
        )
    except BaseException as exc:
        if staging is not None:
            staging.discard()
        problems = _rollback_cuda(cp, locked, checkpointed) if (cp is not None and not dumped) else []
        alive = proctree.is_alive(pid)
        if isinstance(exc, CaptureError):
            raise
        if isinstance(exc, EngineError | OSError):
            note = f" (CUDA rollback problems: {'; '.join(problems)})" if problems else ""
            source = "the source keeps running" if alive else "the source is gone"
            raise CaptureError(f"{exc}{note}; {source}", phase=phase, source_alive=alive) from exc
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
