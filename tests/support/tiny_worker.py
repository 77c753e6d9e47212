"""A stand-in worker for engine tests: a stdlib HTTP server with an init id and a deterministic answer.

Kept independent of the demo worker so engine tests can exercise failure paths cheaply.
usage: python tiny_worker.py PORT READY_FILE [BULK_MIB]

BULK_MIB > 0 adds that much random data in one anonymous mapping (what a CUDA checkpoint leaves in a
worker's host memory); its sha256, recomputed on every request, proves a restore bit-exact.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import sys
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

INIT_ID = uuid.uuid4().hex
# memory that must survive the round trip bit-exactly
STATE = bytearray(hashlib.sha256(INIT_ID.encode()).digest() * (1 << 14))
COUNTER = [0]
BULK: list[mmap.mmap] = []


def make_bulk(mib: int) -> None:
    region = mmap.mmap(-1, mib << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for off in range(0, mib << 20, 1 << 20):
        region[off : off + (1 << 20)] = os.urandom(1 << 20)
    BULK.append(region)


class Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        COUNTER[0] += 1
        answer = {"init_id": INIT_ID, "state": hashlib.sha256(STATE).hexdigest(), "requests": COUNTER[0]}
        if BULK:
            answer["bulk"] = hashlib.sha256(BULK[0]).hexdigest()
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def main() -> None:
    port, ready = int(sys.argv[1]), Path(sys.argv[2])
    if len(sys.argv) > 3 and int(sys.argv[3]) > 0:
        make_bulk(int(sys.argv[3]))
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    ready.write_text(INIT_ID)
    server.serve_forever()


if __name__ == "__main__":
    main()
