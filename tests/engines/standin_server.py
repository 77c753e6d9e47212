"""An engine server STAND-IN: `python -m tests.engines.standin_server PORT JOURNAL`.

Answers GET /health and every admin POST with 200 {}, appending "METHOD PATH?QUERY BODY" to JOURNAL;
it stands in for `vllm serve` / `sglang.launch_server` under the engine launcher.
"""

from __future__ import annotations

import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

JOURNAL = Path(sys.argv[2])


class Handler(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        if self.path != "/health":
            with JOURNAL.open("a") as f:
                f.write(f"{self.command} {self.path} {body}".rstrip() + "\n")
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: object) -> None:
        return


HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
