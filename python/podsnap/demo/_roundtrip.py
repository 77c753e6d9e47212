"""One measured round trip of the demo worker through the engine: cold start -> capture -> restore.

`podsnap.demo.round_trip` is the ONE implementation: `podsnap demo` (which prints its timing table),
the CPU and GPU tests and `bench/gpu_bench.py` all call it, so all of them measure the same thing the
same way:

  cold start  launch of `python -m podsnap.demo` -> its first answer (interpreter, imports, weights,
              compile, warm-up: what a new replica pays without podsnap)
  capture     `podsnap.engine.capture` of the worker (its phases: cuda_lock, cuda_checkpoint, criu_dump,
              reap, hash, publish)
  restore     `podsnap.engine.restore` (verify, compat, criu_restore, cuda_restore, cuda_unlock) plus
              the protocol (restore-context + restore-complete, resume hooks) -> first answer

Before the capture and after the restore it records the answer to a fixed question (tokens too), the
worker's init id and pid, and an exact checksum of every weight on the device, so callers can assert
a bit-exact restore.

With `cached_restore`, the restored worker is stopped and the same artifact restored once more with
`verified_digests` (what a restore from the agent's node-local cache does: the files were verified when
they were cached, so nothing is hashed again), measured and checked the same way (report key `cached`).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podsnap import contract
from podsnap.controldir import ControlDir
from podsnap.demo._sandbox import Sandbox

if TYPE_CHECKING:
    from podsnap.engine import ProgressFn, RestoreOptions

QUESTION = "Explain in one sentence what a snapshot of an inference worker is."
GIB = float(1 << 30)


#: the ports free_port handed out in this process: never twice
_PORTS_GIVEN: set[int] = set()


def free_port() -> int:
    """A free TCP port on 127.0.0.1 for a worker that is dumped and restored: below the kernel's ephemeral
    range and the NodePort range.

    The worker's port is unbound from its dump until its restore binds it again; a port chosen by bind(0)
    lies in the ephemeral range, where any outgoing connection in between may take it, and the restore's
    bind then fails with EADDRINUSE. Ports below that range are never handed out implicitly."""
    try:
        ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768
    hi = min(ephemeral, 30000)  # (kube-proxy holds NodePorts from 30000 up)
    lo = max(1024, hi - 10000)
    for _ in range(500):
        port = random.randrange(lo, hi)
        if port in _PORTS_GIVEN:  # free now, but perhaps not bound yet by whoever asked for it before
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _PORTS_GIVEN.add(port)
        return port
    raise RuntimeError(f"no free TCP port on 127.0.0.1 in {lo}-{hi - 1}")


class RoundTripError(RuntimeError):
    pass


def _request(url: str, body: dict[str, Any] | None = None, timeout: float = 600.0) -> dict[str, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        out: dict[str, Any] = json.loads(r.read())
        return out


def _wait(what: str, check: Callable[[], object], timeout: float, pid: int | None, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
            if check():
                return
        if pid is not None and not Path(f"/proc/{pid}").exists():
            raise RoundTripError(f"worker {pid} exited while waiting for {what}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise RoundTripError(f"timed out after {timeout:g}s waiting for {what}:\n{log.read_text()[-3000:]}")
        time.sleep(0.02)


def gpu_memory_bytes(pid: int) -> int | None:
    """GPU memory the process holds, from nvidia-smi (None where there is no GPU or no answer)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid):
            return int(parts[1]) << 20
    return None


def probe(port: int) -> dict[str, Any]:
    """Answer, tokens, init id, pid and weights checksum of the worker on `port`."""
    base = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    chat = _request(
        f"{base}/v1/chat/completions",
        {"model": "podsnap-demo", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 24},
    )
    first_answer_s = time.monotonic() - t0
    health = _request(f"{base}/health?checksum=1")
    return {
        "answer": chat["choices"][0]["message"]["content"],
        "tokens": chat["podsnap"]["tokens"],
        "init_id": chat["podsnap"]["init_id"],
        "pid": chat["podsnap"]["pid"],
        "weights_checksum": health["weights_checksum"],
        "checksum_s": health.get("checksum_s"),
        "answer_s": first_answer_s,
        "health": {k: v for k, v in health.items() if k not in {"weights_checksum", "checksum_s"}},
    }


def start_detached(cmd: Sequence[str], workdir: Path, env: dict[str, str]) -> tuple[int, Path]:
    """Start `cmd` re-parented to init (a restore needs its PID free, not held by our zombie)."""
    log = workdir / "worker.log"
    pidfile = workdir / "worker.pid"
    pidfile.unlink(missing_ok=True)
    script = f'echo $$ > "{pidfile}"; exec "$@" </dev/null >>"{log}" 2>&1'
    subprocess.run(["setsid", "-f", "sh", "-c", script, "sh", *cmd], check=True, env=env)
    deadline = time.monotonic() + 30
    while not (pidfile.exists() and pidfile.read_text().strip()):
        if time.monotonic() > deadline:
            raise RoundTripError(f"no pid file from the worker launcher ({pidfile})")
        time.sleep(0.01)
    return int(pidfile.read_text()), log


def _exists(pid: int) -> bool:
    """True while `pid` is taken, zombies included (a zombie still blocks its PID for a restore)."""
    return Path(f"/proc/{pid}").exists()


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        children.setdefault(int(stat[stat.rindex(")") + 2 :].split()[1]), []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def stop_worker(pid: int, *, timeout_s: float = 5.0) -> None:
    """SIGTERM the worker, then SIGKILL it and whatever it started; wait until its PID is free."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _exists(pid) and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.02)
    if _exists(pid):
        for p in reversed(_descendants(pid)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, signal.SIGKILL)
        deadline = time.monotonic() + timeout_s
        while _exists(pid) and time.monotonic() < deadline:
            time.sleep(0.02)


class _Resume:
    """A restore measured to the first answer: engine restore, restore-complete, resumed, answered."""

    def __init__(self, ctl: ControlDir, port: int, log: Path, context_env: dict[str, str]) -> None:
        self.ctl, self.port, self.log, self.context_env = ctl, port, log, context_env
        #: the host PID of the last restored worker, set as soon as the engine returns it
        self.pid: int | None = None

    def restore(self, artifact: Path, options: RestoreOptions, progress: ProgressFn | None) -> dict[str, Any]:
        from podsnap.engine import restore

        base = f"http://127.0.0.1:{self.port}"
        t2 = time.monotonic()
        res = restore(artifact, options, progress=progress)
        self.pid = res.pid
        t3 = time.monotonic()
        self.ctl.signal_restored(self.context_env)
        _wait(
            "the restored worker to resume",
            lambda: _request(f"{base}/health", timeout=5).get("restored") is True,
            120,
            res.pid,
            self.log,
        )
        chat = _request(
            f"{base}/v1/chat/completions", {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 24}
        )
        t4 = time.monotonic()
        return {
            "restore_s": t4 - t2,
            "restore": {
                "timings_ms": res.timings_ms,
                "bytes_total": res.bytes_total,
                "pid": res.pid,
                "ns_pid": res.ns_pid,
                "cuda_pids": list(res.cuda_pids),
                "resume_s": t4 - t3,
                "first_answer": chat["choices"][0]["message"]["content"],
                "phase_bytes": dict(res.phase_bytes),
            },
        }


def _exact(before: dict[str, Any], run: dict[str, Any], after: dict[str, Any]) -> tuple[bool, bool]:
    """(bit-exact, same worker): same weights, tokens and answer; same init id and pid (in a sandbox the
    worker reports its namespace PID, which the restore keeps)."""
    return (
        after["weights_checksum"] == before["weights_checksum"]
        and after["tokens"] == before["tokens"]
        and run["restore"]["first_answer"] == before["answer"]
    ), after["init_id"] == before["init_id"] and after["pid"] == before["pid"]


def round_trip(
    workdir: Path,
    worker_args: Sequence[str],
    *,
    port: int,
    artifact_dir: Path | None = None,
    criu_binary: Path | None = None,
    cold_start_timeout_s: float = 600.0,
    keep: bool = False,
    progress: Callable[[str], None] | None = None,
    env: dict[str, str] | None = None,
    after_cold_start: Callable[[], None] | None = None,
    engine_progress: ProgressFn | None = None,
    capture_extra: dict[str, Any] | None = None,
    context_env: dict[str, str] | None = None,
    namespaces: bool = False,
    bulk_hugepages: bool = True,
    digest: str | None = None,
    cached_restore: bool = False,
) -> dict[str, Any]:
    """Run the whole round trip; return a JSON-able report (see module doc). Raises RoundTripError.

    `worker_args` go to `python -m podsnap.demo` (e.g. `--device cuda --weights-gib 8 --cooperative`).
    `after_cold_start()` runs once the source answered, before the capture (e.g. to free the memory
    a weights file in tmpfs holds before the capture needs as much again). `engine_progress` is the
    engine's `progress=` callback for capture and restore; `capture_extra` goes into the manifest;
    `context_env` is the restore context handed to the restored worker. `keep=True` leaves the
    restored worker running and the artifact in place. `namespaces=True` runs the worker in a
    pod-like sandbox (own PID/mount/UTS/IPC namespaces, `podsnap.demo._sandbox`), captures it with
    CRIU inside those namespaces and restores it into a second sandbox, as the agent does in pods.
    `bulk_hugepages` and `digest` (None: the engine's default) go to CaptureOptions; `cached_restore` adds the second restore (module doc).

    Report keys: worker_args, cold_start_s, before, gpu_bytes, capture_s, capture{timings_ms,
    bytes_total, bytes_memory, cuda_pids, phase_bytes}, restore_s, restore{timings_ms, bytes_total, pid,
    cuda_pids, resume_s, first_answer, phase_bytes}, after, bit_exact, same_worker, restore_over_cold;
    with cached_restore also cached{restore_s, restore{...}, after, bit_exact, same_worker}.
    """
    from podsnap.engine import CaptureOptions, RestoreOptions, capture

    say = progress or (lambda _msg: None)
    workdir.mkdir(parents=True, exist_ok=True)
    control = workdir / "control"
    shutil.rmtree(control, ignore_errors=True)
    control.mkdir()
    ctl = ControlDir(control)
    artifact = (artifact_dir or workdir) / "artifact"
    shutil.rmtree(artifact, ignore_errors=True)
    # the worker offers itself once asked, after the "before" answers: a cooperative worker's weights are
    # away from its quiesce on, so it could not answer while offered
    cmd = [sys.executable, "-m", "podsnap.demo", "--host", "127.0.0.1", "--port", str(port), "--offer-on-request"]
    cmd += list(worker_args)
    wenv = {**(env if env is not None else os.environ), contract.ENV_CONTROL_DIR: str(control)}
    report: dict[str, Any] = {"worker_args": list(worker_args), "namespaces": namespaces}
    pid: int | None = None
    resumed: _Resume | None = None
    sandboxes: list[Sandbox] = []
    try:
        if namespaces:
            sandboxes = [Sandbox(workdir / "pod-source"), Sandbox(workdir / "pod-destination")]
        t0 = time.monotonic()
        if namespaces:
            log = workdir / "worker.log"
            pid = sandboxes[0].launch(cmd, wenv, log)
        else:
            pid, log = start_detached(cmd, workdir, wenv)
        say(f"started the worker (pid {pid}, port {port}, log {log})")
        health = f"http://127.0.0.1:{port}/health"
        _wait("the cold start", lambda: _request(health, timeout=5)["status"] == "ok", cold_start_timeout_s, pid, log)
        first = _request(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 24},
        )
        report["cold_start_s"] = time.monotonic() - t0
        before = probe(port)
        if first["choices"][0]["message"]["content"] != before["answer"]:
            raise RoundTripError("the worker gave two answers to one question before any capture")
        report["before"] = before
        report["gpu_bytes"] = gpu_memory_bytes(pid)
        _request(f"http://127.0.0.1:{port}/podsnap/offer", {})
        if after_cold_start is not None:
            after_cold_start()
        say(f"cold start {report['cold_start_s']:.2f}s (pid {pid}); waiting for {contract.FILE_READY_FOR_SNAPSHOT}")
        _wait(contract.FILE_READY_FOR_SNAPSHOT, lambda: ctl.exists(contract.FILE_READY_FOR_SNAPSHOT), 60, pid, log)
        t1 = time.monotonic()
        cap = capture(
            pid,
            artifact,
            CaptureOptions(
                digest=digest or CaptureOptions.digest,
                criu_binary=criu_binary,
                extra=dict(capture_extra or {}),
                namespace_pid=sandboxes[0].init_pid if namespaces else None,
                bulk_hugepages=bulk_hugepages,
            ),
            progress=engine_progress,
        )
        report["capture_s"] = time.monotonic() - t1
        if _exists(pid):
            raise RoundTripError(f"the source (pid {pid}) survived its capture")
        report["capture"] = {
            "timings_ms": cap.timings_ms,
            "bytes_total": cap.bytes_total,
            "digest": cap.manifest.digest,
            "bytes_memory": cap.bytes_memory,
            "cuda_pids": list(cap.cuda_pids),
            "phase_bytes": dict(cap.phase_bytes),
        }
        say(f"captured {cap.bytes_total / GIB:.2f} GiB in {report['capture_s']:.2f}s; the source is gone; restoring")
        options = RestoreOptions(
            criu_binary=criu_binary,
            namespace_pid=sandboxes[1].init_pid if namespaces else None,
            expected_manifest_digest=cap.manifest_digest,
        )
        resumed = _Resume(ctl, port, log, context_env or {"POD_NAME": "podsnap-roundtrip", "POD_IP": "127.0.0.1"})
        primary = resumed.restore(artifact, options, engine_progress)
        report.update(primary)
        report["after"] = probe(port)
        report["bit_exact"], report["same_worker"] = _exact(before, primary, report["after"])
        if cached_restore:
            say("restoring the same artifact again, as from a verified node-local cache (verified_digests)")
            stop_worker(primary["restore"]["pid"])
            ctl.clear_stale()
            again = resumed.restore(artifact, replace(options, verified_digests=True), None)
            again["after"] = probe(port)
            again["bit_exact"], again["same_worker"] = _exact(before, again, again["after"])
            report["cached"] = again
        report["restore_over_cold"] = report["restore_s"] / report["cold_start_s"]
        say(f"restored in {report['restore_s']:.2f}s; bit_exact={report['bit_exact']}")
        if cached_restore:
            cached = report["cached"]
            say(f"restored from the verified cache in {cached['restore_s']:.2f}s; bit_exact={cached['bit_exact']}")
        return report
    finally:
        if resumed is not None and resumed.pid is not None:
            pid = resumed.pid
        if pid is not None and not keep and _exists(pid):
            stop_worker(pid)
        if not keep:
            for sandbox in sandboxes:
                sandbox.stop()
        if not keep:
            shutil.rmtree(artifact, ignore_errors=True)
