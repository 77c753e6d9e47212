"""CUDA driver checkpoint API (`cuda.bindings.driver`, imported lazily) behind a small Protocol.

Sequence measured bit-exact on the H200 (DESIGN.md): cuInit(0) in the capturing process; for every
CUDA pid Lock(timeout 30 s) then Checkpoint (GPU memory moves into the process's host memory and the
GPU is released); CRIU dump; ... CRIU restore; Restore (optionally mapping old -> new GPU UUIDs);
Unlock. All pids here are host pids (the agent runs with hostPID).

`NoCuda` stands in on CPU-only hosts and for CPU-only captures, so nothing here is imported there.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from podsnap.engine._nvml import compute_processes
from podsnap.engine.errors import CudaError

DEFAULT_LOCK_TIMEOUT_MS = 30_000


class CudaCheckpointer(Protocol):
    """What capture/restore need from CUDA. Pids are host pids."""

    def available(self) -> bool: ...

    def cuda_pids(self, pids: Iterable[int]) -> dict[int, list[str]]:
        """Those of `pids` that hold CUDA state -> UUIDs of the GPUs they use (may be empty if unknown)."""
        ...

    def lock(self, pid: int, timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS) -> None: ...

    def checkpoint(self, pid: int) -> None: ...

    def restore(self, pid: int, gpu_pairs: Sequence[tuple[str, str]] = ()) -> None: ...

    def unlock(self, pid: int) -> None: ...

    def state(self, pid: int) -> str: ...

    def restore_thread_id(self, pid: int) -> int: ...


class NoCuda:
    """No CUDA on this host (or a CPU-only capture): no CUDA pids; any call is an error."""

    def __init__(self, reason: str = "CUDA checkpointing is not available on this host") -> None:
        self.reason = reason

    def available(self) -> bool:
        return False

    def cuda_pids(self, pids: Iterable[int]) -> dict[int, list[str]]:
        return {}

    def _no(self, call: str, pid: int) -> None:
        raise CudaError(call, pid, "CUDA_UNAVAILABLE", self.reason)

    def lock(self, pid: int, timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS) -> None:
        self._no("cuCheckpointProcessLock", pid)

    def checkpoint(self, pid: int) -> None:
        self._no("cuCheckpointProcessCheckpoint", pid)

    def restore(self, pid: int, gpu_pairs: Sequence[tuple[str, str]] = ()) -> None:
        self._no("cuCheckpointProcessRestore", pid)

    def unlock(self, pid: int) -> None:
        self._no("cuCheckpointProcessUnlock", pid)

    def state(self, pid: int) -> str:
        self._no("cuCheckpointProcessGetState", pid)
        return ""

    def restore_thread_id(self, pid: int) -> int:
        self._no("cuCheckpointProcessGetRestoreThreadId", pid)
        return 0


def _uses_libcuda(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return "libcuda.so" in Path(f"/proc/{pid}/maps").read_text(errors="replace")
    return False


def uuid_bytes(uuid: str) -> bytes:
    """NVML's 'GPU-8c1e...-...' -> the 16 raw bytes CUuuid holds."""
    text = uuid.removeprefix("GPU-").replace("-", "")
    raw = bytes.fromhex(text)
    if len(raw) != 16:
        raise ValueError(f"GPU UUID {uuid!r} is not 16 bytes")
    return raw


class DriverCuda:
    """The real driver API. Construction is cheap; the first call imports the bindings and runs cuInit(0)."""

    def __init__(self, driver: Any = None) -> None:
        #: the `cuda.bindings.driver` module (injectable so the error mapping can be tested without a GPU)
        self._module: Any = driver
        self._drv: Any = None

    def _driver(self) -> Any:
        if self._drv is None:
            driver = self._module
            if driver is None:
                try:
                    from cuda.bindings import driver as imported
                except ImportError as exc:
                    raise CudaError(
                        "import cuda.bindings.driver", None, "ImportError", "pip install 'podsnap[gpu]'"
                    ) from exc
                driver = imported
            if not hasattr(driver, "cuCheckpointProcessLock"):
                raise CudaError("cuCheckpointProcessLock", None, "MISSING", "cuda-bindings >= 12.8 needed")
            self._drv = driver
            try:
                self._check("cuInit", None, driver.cuInit(0))
            except CudaError:
                self._drv = None
                raise
            except Exception as exc:  # the bindings raise (not return) when libcuda cannot be loaded
                self._drv = None
                raise CudaError("cuInit", None, type(exc).__name__, str(exc)) from exc
        return self._drv

    def _name(self, err: Any) -> str:
        with contextlib.suppress(Exception):
            res = self._drv.cuGetErrorName(err)
            if int(res[0]) == 0:
                name = res[1]
                return name.decode() if isinstance(name, bytes) else str(name)
        return f"CUresult({int(err)})"

    def _check(self, call: str, pid: int | None, result: Any) -> Any:
        err = result[0] if isinstance(result, tuple) else result
        if int(err) != 0:
            raise CudaError(call, pid, self._name(err))
        if isinstance(result, tuple) and len(result) > 1:
            return result[1] if len(result) == 2 else result[1:]
        return None

    def available(self) -> bool:
        try:
            self._driver()
        except CudaError:
            return False
        return True

    def cuda_pids(self, pids: Iterable[int]) -> dict[int, list[str]]:
        wanted = list(pids)
        nvml = compute_processes()
        if nvml is not None:
            return {p: nvml[p] for p in wanted if p in nvml}
        # no NVML: a process that mapped libcuda and that the driver knows a checkpoint state for
        out: dict[int, list[str]] = {}
        for p in wanted:
            if _uses_libcuda(p):
                with contextlib.suppress(CudaError):
                    self.state(p)
                    out[p] = []
        return out

    def lock(self, pid: int, timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS) -> None:
        drv = self._driver()
        args = drv.CUcheckpointLockArgs()
        args.timeoutMs = int(timeout_ms)
        self._check("cuCheckpointProcessLock", pid, drv.cuCheckpointProcessLock(pid, args))

    def checkpoint(self, pid: int) -> None:
        drv = self._driver()
        self._check("cuCheckpointProcessCheckpoint", pid, drv.cuCheckpointProcessCheckpoint(pid, None))

    def _restore_args(self, gpu_pairs: Sequence[tuple[str, str]]) -> Any:
        drv = self._drv
        pairs = [(o, n) for o, n in gpu_pairs if o != n]
        if not pairs:
            return None
        if not hasattr(drv, "CUcheckpointGpuPair"):
            raise CudaError(
                "cuCheckpointProcessRestore",
                None,
                "NOT_SUPPORTED",
                "these cuda-bindings cannot remap GPUs (need CUDA 13)",
            )
        items = []
        for old, new in pairs:
            pair = drv.CUcheckpointGpuPair()
            # CUuuid.bytes is read-only: build each from a 16-byte buffer; the pair copies the value
            o_buf = ctypes.create_string_buffer(uuid_bytes(old), 16)
            n_buf = ctypes.create_string_buffer(uuid_bytes(new), 16)
            pair.oldUuid = drv.CUuuid(ctypes.addressof(o_buf))
            pair.newUuid = drv.CUuuid(ctypes.addressof(n_buf))
            items.append(pair)
        args = drv.CUcheckpointRestoreArgs()
        args.gpuPairs = items  # copied into the args' own array
        args.gpuPairsCount = len(items)
        return args

    def restore(self, pid: int, gpu_pairs: Sequence[tuple[str, str]] = ()) -> None:
        drv = self._driver()
        try:
            args = self._restore_args(gpu_pairs)
        except CudaError as exc:
            raise CudaError("cuCheckpointProcessRestore", pid, exc.error, str(exc)) from exc
        self._check("cuCheckpointProcessRestore", pid, drv.cuCheckpointProcessRestore(pid, args))

    def unlock(self, pid: int) -> None:
        drv = self._driver()
        self._check("cuCheckpointProcessUnlock", pid, drv.cuCheckpointProcessUnlock(pid, None))

    def state(self, pid: int) -> str:
        drv = self._driver()
        value = self._check("cuCheckpointProcessGetState", pid, drv.cuCheckpointProcessGetState(pid))
        name = getattr(value, "name", str(value))
        return str(name).removeprefix("CU_PROCESS_STATE_")

    def restore_thread_id(self, pid: int) -> int:
        drv = self._driver()
        return int(
            self._check("cuCheckpointProcessGetRestoreThreadId", pid, drv.cuCheckpointProcessGetRestoreThreadId(pid))
        )


def default_checkpointer() -> CudaCheckpointer:
    """DriverCuda where the bindings and a driver exist, else NoCuda (importable everywhere)."""
    if not Path("/dev/nvidiactl").exists():
        return NoCuda("no NVIDIA driver on this host (/dev/nvidiactl missing)")
    try:
        import cuda.bindings.driver  # noqa: F401
    except ImportError:
        return NoCuda("cuda-bindings not installed (pip install 'podsnap[gpu]')")
    return DriverCuda()
