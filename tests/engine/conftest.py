"""Engine tests: real CRIU on real processes (CPU). Workers are started detached (setsid -f) so they are
re-parented to init before a dump, as a restore of the same PID needs."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.criu import criu  # noqa: F401  (the one CRIU fixture)
from tests.support.processes import Worker
from tests.support.root_pods import make_pod, programs  # noqa: F401  (pods with a root of their own)


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Worker]:
    w = Worker(tmp_path / "worker")
    yield w
    w.kill()


@pytest.fixture
def node_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The system temp dir the engine makes its private dirs in (CRIU's work dir, the restore's copy of the
    images), as a dir of this test's own: what is left there, and where CRIU was pointed, can be seen."""
    path = tmp_path / "node-tmp"
    path.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    return path
