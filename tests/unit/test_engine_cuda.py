"""DriverCuda's calls and error mapping, against a stand-in for `cuda.bindings.driver` (FakeDriver: no
GPU in CI; the real module runs under `-m gpu`). Results follow the bindings' shape: (CUresult, value)."""

from __future__ import annotations

from typing import Any

import pytest

from podsnap.engine import CudaError, DriverCuda


class Result(int):
    """Stands in for the bindings' CUresult enum (an int subclass)."""


class FakeDriver:
    def __init__(self, init: int = 0, fail: dict[str, int] | None = None) -> None:
        self.init = init
        self.fail = fail or {}
        self.calls: list[tuple[str, Any]] = []

    class CUcheckpointLockArgs:
        timeoutMs = 0

    def _ret(self, name: str, *value: Any) -> tuple[Any, ...]:
        return (Result(self.fail.get(name, 0)), *value)

    def cuInit(self, flags: int) -> tuple[Any, ...]:
        self.calls.append(("cuInit", flags))
        return (Result(self.init),)

    def cuGetErrorName(self, err: int) -> tuple[Any, ...]:
        return (Result(0), {100: b"CUDA_ERROR_NO_DEVICE", 401: b"CUDA_ERROR_ILLEGAL_STATE"}[int(err)])

    def cuCheckpointProcessLock(self, pid: int, args: Any) -> tuple[Any, ...]:
        self.calls.append(("lock", (pid, args.timeoutMs)))
        return self._ret("lock")

    def cuCheckpointProcessCheckpoint(self, pid: int, args: Any) -> tuple[Any, ...]:
        self.calls.append(("checkpoint", pid))
        return self._ret("checkpoint")

    def cuCheckpointProcessRestore(self, pid: int, args: Any) -> tuple[Any, ...]:
        self.calls.append(("restore", (pid, args)))
        return self._ret("restore")

    def cuCheckpointProcessUnlock(self, pid: int, args: Any) -> tuple[Any, ...]:
        self.calls.append(("unlock", pid))
        return self._ret("unlock")

    def cuCheckpointProcessGetState(self, pid: int) -> tuple[Any, ...]:
        class State:
            name = "CU_PROCESS_STATE_CHECKPOINTED"

        return self._ret("state", State())

    def cuCheckpointProcessGetRestoreThreadId(self, pid: int) -> tuple[Any, ...]:
        return self._ret("tid", 4242)


def test_calls_pass_pid_and_timeout_and_init_runs_once() -> None:
    drv = FakeDriver()
    cuda = DriverCuda(driver=drv)
    cuda.lock(7, 30_000)
    cuda.checkpoint(7)
    cuda.restore(7)
    cuda.unlock(7)
    assert drv.calls == [
        ("cuInit", 0),
        ("lock", (7, 30_000)),
        ("checkpoint", 7),
        ("restore", (7, None)),
        ("unlock", 7),
    ]
    assert cuda.state(7) == "CHECKPOINTED"
    assert cuda.restore_thread_id(7) == 4242


def test_errors_name_the_call_the_pid_and_the_error() -> None:
    cuda = DriverCuda(driver=FakeDriver(fail={"checkpoint": 401}))
    with pytest.raises(CudaError) as err:
        cuda.checkpoint(9)
    assert (err.value.call, err.value.pid, err.value.error) == (
        "cuCheckpointProcessCheckpoint",
        9,
        "CUDA_ERROR_ILLEGAL_STATE",
    )
    assert str(err.value) == "cuCheckpointProcessCheckpoint for pid 9 failed with CUDA_ERROR_ILLEGAL_STATE"


def test_failed_init_is_a_cuda_error_and_means_unavailable() -> None:
    cuda = DriverCuda(driver=FakeDriver(init=100))
    assert cuda.available() is False
    with pytest.raises(CudaError, match="cuInit failed with CUDA_ERROR_NO_DEVICE"):
        cuda.lock(1)


def test_remapping_gpus_needs_bindings_that_can() -> None:
    cuda = DriverCuda(driver=FakeDriver())
    cuda.restore(3, [("GPU-a", "GPU-a")])  # same GPU: plain restore
    with pytest.raises(CudaError, match="cannot remap GPUs"):
        cuda.restore(3, [("GPU-8c1e2a3b-0000-1111-2222-333344445555", "GPU-00000000-0000-1111-2222-333344445555")])
