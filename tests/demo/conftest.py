"""A real demo worker process per session (CPU, numpy), with torch made unimportable inside it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.criu import criu  # noqa: F401

# `import torch` raises inside the worker: the CPU path must never need it
NO_TORCH = "import sys; sys.modules['torch'] = None; from podsnap.demo import main; sys.exit(main(sys.argv[1:]))"
SERVING = re.compile(r"serving on http://[^:]+:(\d+) init_id=(\S+) pid=(\d+)")


@dataclass
class DemoWorker:
    proc: subprocess.Popen[str]
    port: int
    init_id: str
    pid: int
    log: Path

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def get(self, path: str) -> tuple[int, dict[str, Any], dict[str, str]]:
        return self._open(urllib.request.Request(self.url(path)))

    def post(self, path: str, body: bytes | dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(self.url(path), data=data, headers={"Content-Type": "application/json"})
        return self._open(req)

    def chat(self, content: str, **extra: Any) -> dict[str, Any]:
        status, body, _ = self.post(
            "/v1/chat/completions", {"messages": [{"role": "user", "content": content}], **extra}
        )
        assert status == 200, body
        return body

    @staticmethod
    def _open(req: urllib.request.Request) -> tuple[int, dict[str, Any], dict[str, str]]:
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read()), dict(r.headers)
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read()), dict(e.headers)

    def stop(self) -> int:
        self.proc.terminate()
        return self.proc.wait(timeout=30)


def start_worker(tmp: Path, args: Sequence[str], env: dict[str, str] | None = None) -> DemoWorker:
    tmp.mkdir(parents=True, exist_ok=True)
    log = tmp / "worker.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", NO_TORCH, "--host", "127.0.0.1", "--port", "0", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
    deadline = time.monotonic() + 60
    while True:
        m = SERVING.search(log.read_text())
        if m:
            return DemoWorker(proc, int(m.group(1)), m.group(2), int(m.group(3)), log)
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"demo worker did not start:\n{log.read_text()}")
        time.sleep(0.05)


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoWorker]:
    w = start_worker(tmp_path_factory.mktemp("demo"), ["--device", "auto", "--no-snapshot"])
    yield w
    w.stop()
