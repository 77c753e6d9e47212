"""Real processes for the engine and agent tests: detached tiny workers, pod-like sandboxes, HTTP probes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from podsnap.demo import free_port
from podsnap.engine import _proctree as proctree

HERE = Path(__file__).resolve().parent
TINY_WORKER = HERE / "tiny_worker.py"


def http_get(port: int, path: str = "/", timeout: float = 5.0) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
        data: dict[str, Any] = json.loads(r.read())
        return data


class Worker:
    """A detached tiny worker: its parent is init, not us."""

    def __init__(self, workdir: Path, bulk_mib: int = 0) -> None:
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        ready = self.dir / "ready"
        pidfile = self.dir / "pid"
        cmd = (
            f"echo $$ > {pidfile}; exec {sys.executable} {TINY_WORKER} {self.port} {ready} {bulk_mib} "
            f"</dev/null >{self.dir}/log 2>&1"
        )
        subprocess.run(["setsid", "-f", "sh", "-c", cmd], check=True)
        deadline = time.monotonic() + 20
        # the worker writes its init id into `ready`: wait for the content, not just the file
        while not (ready.exists() and ready.read_text()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"tiny worker did not start: {(self.dir / 'log').read_text()}")
            time.sleep(0.05)
        self.pid = int(pidfile.read_text())
        self.init_id = ready.read_text()

    def get(self) -> dict[str, Any]:
        return http_get(self.port)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        proctree.wait_gone(self.pid, timeout_s=10)


POD_INIT = HERE / "pod_init.py"


def children_of(pid: int) -> list[int]:
    """The PIDs whose parent is `pid`, read from /proc."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
                    out.append(int(entry.name))
    return out


class Pod:
    """A pod-like sandbox: own PID, mount, UTS and IPC namespaces (host network), a reaping PID 1, and
    empty tmpfs mounts over `hide` so host-side dirs (CRIU, artifacts) are invisible inside."""

    def __init__(self, workdir: Path, hide: list[Path]) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.dir = workdir
        pidfile, log = workdir / "unshare.pid", workdir / "pod.log"
        args = " ".join(str(h) for h in hide)
        cmd = (
            f"echo $$ > {pidfile}; exec unshare --pid --mount --uts --ipc --fork --mount-proc "
            f"{sys.executable} {POD_INIT} {args} </dev/null >{log} 2>&1"
        )
        subprocess.run(["setsid", "-f", "sh", "-c", cmd], check=True)
        deadline = time.monotonic() + 20
        while "pod ready" not in (log.read_text() if log.exists() else ""):
            if time.monotonic() > deadline:
                raise TimeoutError(f"pod did not start: {log.read_text() if log.exists() else ''}")
            time.sleep(0.05)
        self.unshare_pid = int(pidfile.read_text())
        (self.init_pid,) = children_of(self.unshare_pid)

    def exec(self, *cmd: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["nsenter", "-t", str(self.init_pid), "-m", "-u", "-i", "-n", "-p", "--", *cmd],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )

    def start_worker(self, workdir: Path, bulk_mib: int = 0) -> tuple[int, int, str]:
        """Start a tiny worker inside, re-parented to the pod's PID 1: (port, namespace pid, init id)."""
        workdir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        ready, pidfile = workdir / "ready", workdir / "pid"
        script = (
            f"echo $$ > {pidfile}; exec {sys.executable} {TINY_WORKER} {port} {ready} {bulk_mib} "
            f"</dev/null >{workdir}/log 2>&1"
        )
        r = self.exec("setsid", "-f", "sh", "-c", script)
        assert r.returncode == 0, r.stderr
        deadline = time.monotonic() + 60
        while not (ready.exists() and ready.read_text()):
            if time.monotonic() > deadline:
                raise TimeoutError("worker in pod did not start")
            time.sleep(0.05)
        return port, int(pidfile.read_text()), ready.read_text()

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.unshare_pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.init_pid, signal.SIGKILL)  # PID 1 dying takes the whole PID namespace with it
