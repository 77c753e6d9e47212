"""Progress lines on stderr for long phases (rewritten in place on a terminal)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from podsnap.engine import Progress

GIB = float(1 << 30)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


class ProgressPrinter:
    """A `progress=` callback: one line per phase, updated at most every 0.2 s."""

    def __init__(self, stream: TextIO | None = None, prefix: str = "") -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.prefix = prefix
        self._last = 0.0

    def __call__(self, p: Progress) -> None:
        now = time.monotonic()
        if not p.finished and (now - self._last < 0.2 or not self.tty):
            return
        self._last = now
        parts = [f"{self.prefix}{p.phase:<16}"]
        if p.total:
            parts.append(f"{human_bytes(p.done)} / {human_bytes(p.total)}")
        elif p.done:
            parts.append(human_bytes(p.done))
        if p.elapsed_ms:
            parts.append(f"{p.elapsed_ms / 1000:.2f} s")
            if p.done and p.elapsed_ms > 0:
                parts.append(f"{p.done / GIB / (p.elapsed_ms / 1000):.2f} GiB/s")
        line = "  ".join(parts)
        if self.tty:
            self.stream.write("\r\033[K" + line + ("\n" if p.finished else ""))
        elif p.finished:
            self.stream.write(line + "\n")
        self.stream.flush()
