"""Engine tests: real CRIU on real processes (CPU). Workers are started detached (setsid -f) so they are
re-parented to init before a dump, as a restore of the same PID needs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from podsnap.engine import Criu, CriuError, find_binary

from .helpers import Worker


@pytest.fixture(scope="session")
def criu() -> Criu:
    if os.geteuid() != 0:
        pytest.skip("CRIU needs root")
    try:
        runner = Criu(find_binary())
        runner.version()
    except CriuError as exc:
        pytest.skip(f"CRIU unusable: {str(exc).splitlines()[0]}")
    return runner


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Worker]:
    w = Worker(tmp_path / "worker")
    yield w
    w.kill()
