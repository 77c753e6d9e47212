"""The CUDA sequence around CRIU, with tests/support/fake_cuda.FakeCudaDriver standing in for the driver
(a FAKE: there is no GPU in CI; the real driver path runs under `-m gpu` on the H200). It refuses the
transitions the real driver refuses, so a call out of order fails here too. The processes and CRIU are real."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import pytest

from podsnap.engine import CaptureError, Criu, RestoreError, capture, restore
from podsnap.engine import _proctree as proctree
from tests.support.fake_cuda import CHECKPOINTED, RUNNING, FakeCudaDriver
from tests.support.processes import Worker, http_get

from .test_capture_restore import _failing_criu

pytestmark = pytest.mark.slow


def driver(
    tmp_path: Path, cuda_pids: Iterable[int] = (), *, fail: str | None = None, name: str = "cuda"
) -> FakeCudaDriver:
    """A driver with its own state; a second `name` stands for another node's driver."""
    return FakeCudaDriver(tmp_path / name, cuda_pids, fail=fail)


def restore_node(tmp_path: Path, pid: int, *, fail: str | None = None) -> FakeCudaDriver:
    """The restore side's driver: CRIU brings the process back with its CUDA state checkpointed."""
    node = driver(tmp_path, fail=fail, name="cuda-restore")
    node.set_state(pid, CHECKPOINTED)
    return node


def test_capture_runs_lock_checkpoint_then_dump_and_restore_runs_restore_then_unlock(
    criu: Criu, worker: Worker, tmp_path: Path
) -> None:
    fake = driver(tmp_path, [worker.pid])
    result = capture(worker.pid, tmp_path / "art", cuda=fake, criu=criu)
    assert fake.calls() == [("lock", worker.pid), ("checkpoint", worker.pid)]
    assert fake.state(worker.pid) == CHECKPOINTED
    assert result.cuda_pids == (worker.pid,)
    assert {"cuda_lock", "cuda_checkpoint"} <= set(result.timings_ms)
    manifest = json.loads((tmp_path / "art" / "manifest.json").read_text())
    assert manifest["process"]["cudaPids"] == [worker.pid]

    node = restore_node(tmp_path, worker.pid)
    restored = restore(tmp_path / "art", cuda=node, criu=criu)
    assert node.calls() == [("restore", worker.pid), ("unlock", worker.pid)]
    assert node.state(worker.pid) == RUNNING
    assert restored.cuda_pids == (worker.pid,)
    assert http_get(worker.port)["init_id"] == worker.init_id


def test_criu_failure_after_cuda_checkpoint_restores_and_unlocks_the_source(
    criu: Criu, worker: Worker, tmp_path: Path
) -> None:
    fake = driver(tmp_path, [worker.pid])
    with pytest.raises(CaptureError) as err:
        capture(worker.pid, tmp_path / "art", cuda=fake, criu=_failing_criu(tmp_path, criu, "dump"))
    assert fake.calls() == [
        ("lock", worker.pid),
        ("checkpoint", worker.pid),
        ("restore", worker.pid),
        ("unlock", worker.pid),
    ]
    assert fake.state(worker.pid) == RUNNING, "the source has its CUDA state back"
    assert err.value.source_alive
    assert http_get(worker.port)["init_id"] == worker.init_id
    assert not (tmp_path / "art").exists()


def test_lock_failure_leaves_the_source_untouched(criu: Criu, worker: Worker, tmp_path: Path) -> None:
    fake = driver(tmp_path, [worker.pid], fail="lock")
    with pytest.raises(CaptureError, match="CUDA_ERROR_ILLEGAL_STATE") as err:
        capture(worker.pid, tmp_path / "art", cuda=fake, criu=criu)
    assert err.value.phase == "cuda_lock"
    assert fake.calls() == [("lock", worker.pid)]
    assert fake.state(worker.pid) == RUNNING
    assert http_get(worker.port)["init_id"] == worker.init_id


def test_cuda_restore_failure_kills_the_restored_process(criu: Criu, worker: Worker, tmp_path: Path) -> None:
    capture(worker.pid, tmp_path / "art", cuda=driver(tmp_path, [worker.pid]), criu=criu)
    node = restore_node(tmp_path, worker.pid, fail="restore")
    with pytest.raises(RestoreError, match="cuda_restore"):
        restore(tmp_path / "art", cuda=node, criu=criu)
    assert node.calls() == [("restore", worker.pid)]
    assert proctree.wait_gone(worker.pid, timeout_s=10), "no half-restored process left running"
    with pytest.raises(OSError):
        http_get(worker.port, timeout=1)


def test_leave_running_keeps_the_source_serving_and_resumes_its_cuda_state(
    criu: Criu, worker: Worker, tmp_path: Path
) -> None:
    from podsnap.engine import CaptureOptions

    fake = driver(tmp_path, [worker.pid])
    capture(worker.pid, tmp_path / "art", CaptureOptions(leave_running=True), cuda=fake, criu=criu)
    assert fake.calls() == [
        ("lock", worker.pid),
        ("checkpoint", worker.pid),
        ("restore", worker.pid),
        ("unlock", worker.pid),
    ]
    assert fake.state(worker.pid) == RUNNING
    assert http_get(worker.port)["init_id"] == worker.init_id, "the source still serves"
    worker.kill()
    restore(tmp_path / "art", cuda=restore_node(tmp_path, worker.pid), criu=criu)
    assert http_get(worker.port)["init_id"] == worker.init_id
