"""Fixtures of the engine tests: the cached engine sources and a recording HTTP stand-in."""

from __future__ import annotations

import json
import subprocess
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.engines.apisurface import SourceTree

REPO = Path(__file__).resolve().parents[2]


def engine_sources() -> Path | None:
    """The directory hack/engines.sh fills, or None when it has not run."""
    out = subprocess.run(
        [str(REPO / "hack" / "engines.sh"), "--print-dir"], capture_output=True, text=True, check=False
    )
    path = Path(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else None
    return path if path is not None and (path / ".complete").exists() else None


@pytest.fixture(scope="session")
def engine_src() -> Path:
    path = engine_sources()
    if path is None:
        pytest.skip("engine sources not cached: run `make setup` (hack/engines.sh)")
    return path


@pytest.fixture(scope="session")
def sources(engine_src: Path) -> SourceTree:
    return SourceTree(engine_src)


class HttpStandIn:
    """A real HTTP server on loopback standing in for an engine's admin endpoints: it records every
    request (method, path, query, JSON body) and answers 200 {} unless told to fail a path."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, list[str]], Any]] = []
        self.fail: dict[str, tuple[int, str]] = {}
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                stand_in.requests.append((self.command, url.path, urllib.parse.parse_qs(url.query), body))
                status, text = stand_in.fail.get(url.path, (200, "{}"))
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _handle

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> HttpStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=10)


@pytest.fixture
def http_stand_in() -> Iterator[HttpStandIn]:
    with HttpStandIn() as server:
        yield server
