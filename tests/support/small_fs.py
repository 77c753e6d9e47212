"""Small real filesystems that fill up: a tmpfs mounted with a size limit (root only)."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (e.g. "16m") mounted at `where` while the block runs; skips without root."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    where.mkdir(parents=True, exist_ok=True)
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)]
    got = subprocess.run(mount, check=False, capture_output=True)
    if got.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {got.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(fs: Path) -> Path:
    """Write a file on `fs` until the filesystem is full (ENOSPC); returns it."""
    path = fs / "filler"
    chunk = b"\xa5" * (1 << 20)
    with path.open("wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
        with contextlib.suppress(OSError):
            while True:
                f.write(b"\xa5" * 4096)
    return path
