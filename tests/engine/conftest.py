"""Engine tests: real CRIU on real processes (CPU). Workers are started detached (setsid -f) so they are
re-parented to init before a dump, as a restore of the same PID needs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.criu import criu  # noqa: F401  (the one CRIU fixture)
from tests.support.processes import Worker


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Worker]:
    w = Worker(tmp_path / "worker")
    yield w
    w.kill()
