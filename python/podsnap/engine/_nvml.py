"""GPU facts through NVML (`nvidia-ml-py`, imported lazily): absent library or driver means "no GPUs"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    memory_total_bytes: int = 0
    mig_mode: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "name": self.name,
            "memoryTotalBytes": self.memory_total_bytes,
            "migMode": self.mig_mode,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuInfo:
        return cls(
            index=int(data.get("index", 0)),
            uuid=str(data.get("uuid", "")),
            name=str(data.get("name", "")),
            memory_total_bytes=int(data.get("memoryTotalBytes", 0)),
            mig_mode=bool(data.get("migMode", False)),
        )


@dataclass(frozen=True)
class GpuFacts:
    driver_version: str | None
    gpus: tuple[GpuInfo, ...]
    #: why facts are missing (no library, no driver); None when NVML answered
    unavailable_reason: str | None = None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml() -> Any:
    """The initialized pynvml module, or raise RuntimeError saying why not."""
    try:
        import pynvml
    except ImportError as exc:
        raise RuntimeError("nvidia-ml-py not installed (pip install 'podsnap[gpu]')") from exc
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # pynvml raises NVMLError subclasses; no driver is the common case
        raise RuntimeError(f"NVML init failed: {exc}") from exc
    return pynvml


def gpu_facts() -> GpuFacts:
    """Driver version and every visible GPU (model, UUID, memory, MIG mode)."""
    try:
        nv = _nvml()
    except RuntimeError as exc:
        return GpuFacts(driver_version=None, gpus=(), unavailable_reason=str(exc))
    try:
        driver = _text(nv.nvmlSystemGetDriverVersion())
        gpus = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            try:
                mig = bool(nv.nvmlDeviceGetMigMode(h)[0])
            except Exception:  # MIG is unsupported on most GPUs: NVMLError_NotSupported
                mig = False
            gpus.append(
                GpuInfo(
                    index=i,
                    uuid=_text(nv.nvmlDeviceGetUUID(h)),
                    name=_text(nv.nvmlDeviceGetName(h)),
                    memory_total_bytes=int(nv.nvmlDeviceGetMemoryInfo(h).total),
                    mig_mode=mig,
                )
            )
        return GpuFacts(driver_version=driver, gpus=tuple(gpus))
    finally:
        nv.nvmlShutdown()


def compute_processes() -> dict[int, list[str]] | None:
    """Host PID -> UUIDs of the GPUs it holds memory on; None when NVML cannot tell."""
    try:
        nv = _nvml()
    except RuntimeError:
        return None
    try:
        out: dict[int, list[str]] = {}
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            uuid = _text(nv.nvmlDeviceGetUUID(h))
            for proc in nv.nvmlDeviceGetComputeRunningProcesses(h):
                out.setdefault(int(proc.pid), []).append(uuid)
        return out
    except Exception:
        return None
    finally:
        nv.nvmlShutdown()
