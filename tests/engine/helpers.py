"""Helpers of the engine tests: detached tiny workers and HTTP probes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from podsnap.engine import proctree

HERE = Path(__file__).resolve().parent
TINY_WORKER = HERE / "tiny_worker.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(port: int, path: str = "/", timeout: float = 5.0) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
        data: dict[str, Any] = json.loads(r.read())
        return data


class Worker:
    """A detached tiny worker: its parent is init, not us."""

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        ready = self.dir / "ready"
        pidfile = self.dir / "pid"
        cmd = f"echo $$ > {pidfile}; exec {sys.executable} {TINY_WORKER} {self.port} {ready} </dev/null >{self.dir}/log 2>&1"
        subprocess.run(["setsid", "-f", "sh", "-c", cmd], check=True)
        deadline = time.monotonic() + 20
        while not ready.exists():
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
