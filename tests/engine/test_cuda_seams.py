"""The CUDA sequence around CRIU, with a recording stand-in for the driver (FakeCuda: there is no GPU in
CI; the real driver path runs under `-m gpu` on the H200). The processes and CRIU are real."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest

from podsnap.engine import CaptureError, Criu, CudaError, RestoreError, capture, restore
from podsnap.engine import _proctree as proctree
from tests.support.processes import Worker, http_get

from .test_capture_restore import _failing_criu

pytestmark = pytest.mark.slow


class FakeCuda:
    """Records the driver calls; `fail` names a call that raises like the driver would."""

    def __init__(self, cuda_pids: Iterable[int] = (), fail: str | None = None) -> None:
        self.pids = set(cuda_pids)
        self.fail = fail
        self.calls: list[tuple[str, int]] = []

    def available(self) -> bool:
        return True

    def cuda_pids(self, pids: Iterable[int]) -> dict[int, list[str]]:
        return {p: [] for p in pids if p in self.pids}

    def _call(self, name: str, pid: int) -> None:
        self.calls.append((name, pid))
        if name == self.fail:
            raise CudaError(f"cuCheckpointProcess{name.title()}", pid, "CUDA_ERROR_ILLEGAL_STATE")

    def lock(self, pid: int, timeout_ms: int = 30_000) -> None:
        self._call("lock", pid)

    def checkpoint(self, pid: int) -> None:
        self._call("checkpoint", pid)

    def restore(self, pid: int, gpu_pairs: Sequence[tuple[str, str]] = ()) -> None:
        self._call("restore", pid)

    def unlock(self, pid: int) -> None:
        self._call("unlock", pid)

    def state(self, pid: int) -> str:
        return "RUNNING"

    def restore_thread_id(self, pid: int) -> int:
        return pid


def test_capture_runs_lock_checkpoint_then_dump_and_restore_runs_restore_then_unlock(
    criu: Criu, worker: Worker, tmp_path: Path
) -> None:
    fake = FakeCuda([worker.pid])
    result = capture(worker.pid, tmp_path / "art", cuda=fake, criu=criu)
    assert fake.calls == [("lock", worker.pid), ("checkpoint", worker.pid)]
    assert result.cuda_pids == (worker.pid,)
    assert {"cuda_lock", "cuda_checkpoint"} <= set(result.timings_ms)
    manifest = json.loads((tmp_path / "art" / "manifest.json").read_text())
    assert manifest["process"]["cudaPids"] == [worker.pid]

    fake2 = FakeCuda()
    restored = restore(tmp_path / "art", cuda=fake2, criu=criu)
    assert fake2.calls == [("restore", worker.pid), ("unlock", worker.pid)]
    assert restored.cuda_pids == (worker.pid,)
    assert http_get(worker.port)["init_id"] == worker.init_id


def test_criu_failure_after_cuda_checkpoint_restores_and_unlocks_the_source(
    criu: Criu, worker: Worker, tmp_path: Path
) -> None:
    fake = FakeCuda([worker.pid])
    with pytest.raises(CaptureError) as err:
        capture(worker.pid, tmp_path / "art", cuda=fake, criu=_failing_criu(tmp_path, criu, "dump"))
    assert fake.calls == [
        ("lock", worker.pid),
        ("checkpoint", worker.pid),
        ("restore", worker.pid),
        ("unlock", worker.pid),
    ]
    assert err.value.source_alive
    assert http_get(worker.port)["init_id"] == worker.init_id
    assert not (tmp_path / "art").exists()


def test_lock_failure_leaves_the_source_untouched(criu: Criu, worker: Worker, tmp_path: Path) -> None:
    fake = FakeCuda([worker.pid], fail="lock")
    with pytest.raises(CaptureError, match="CUDA_ERROR_ILLEGAL_STATE") as err:
        capture(worker.pid, tmp_path / "art", cuda=fake, criu=criu)
    assert err.value.phase == "cuda_lock"
    assert fake.calls == [("lock", worker.pid)]
    assert http_get(worker.port)["init_id"] == worker.init_id


def test_cuda_restore_failure_kills_the_restored_process(criu: Criu, worker: Worker, tmp_path: Path) -> None:
    capture(worker.pid, tmp_path / "art", cuda=FakeCuda([worker.pid]), criu=criu)
    fake = FakeCuda(fail="restore")
    with pytest.raises(RestoreError, match="cuda_restore"):
        restore(tmp_path / "art", cuda=fake, criu=criu)
    assert fake.calls == [("restore", worker.pid)]
    assert proctree.wait_gone(worker.pid, timeout_s=10), "no half-restored process left running"
    with pytest.raises(OSError):
        http_get(worker.port, timeout=1)


def test_leave_running_keeps_the_source_serving_and_resumes_its_cuda_state(
    criu: Criu, worker: Worker, tmp_path: Path
) -> None:
    from podsnap.engine import CaptureOptions

    fake = FakeCuda([worker.pid])
    capture(worker.pid, tmp_path / "art", CaptureOptions(leave_running=True), cuda=fake, criu=criu)
    assert fake.calls == [
        ("lock", worker.pid),
        ("checkpoint", worker.pid),
        ("restore", worker.pid),
        ("unlock", worker.pid),
    ]
    assert http_get(worker.port)["init_id"] == worker.init_id, "the source still serves"
    worker.kill()
    restore(tmp_path / "art", cuda=FakeCuda(), criu=criu)
    assert http_get(worker.port)["init_id"] == worker.init_id
