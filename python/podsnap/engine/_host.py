"""Facts about this host that a restore must match (arch, kernel, glibc, memory, GPUs)."""

from __future__ import annotations

import os
import platform
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from podsnap.engine._nvml import GpuInfo, gpu_facts


def meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes."""
    out: dict[str, int] = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return out


def glibc_version() -> str:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        return " ".join(platform.libc_ver())


@dataclass(frozen=True)
class HostFacts:
    hostname: str
    arch: str
    kernel: str
    glibc: str
    mem_total_bytes: int
    mem_available_bytes: int
    driver_version: str | None = None
    gpus: tuple[GpuInfo, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {
            "hostname": self.hostname,
            "arch": self.arch,
            "kernel": self.kernel,
            "glibc": self.glibc,
            "memTotalBytes": self.mem_total_bytes,
            "memAvailableBytes": self.mem_available_bytes,
            "driverVersion": self.driver_version,
            "gpus": [g.to_dict() for g in self.gpus],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HostFacts:
        gpus = data.get("gpus") or []
        return cls(
            hostname=str(data.get("hostname", "")),
            arch=str(data.get("arch", "")),
            kernel=str(data.get("kernel", "")),
            glibc=str(data.get("glibc", "")),
            mem_total_bytes=int(data.get("memTotalBytes", 0)),
            mem_available_bytes=int(data.get("memAvailableBytes", 0)),
            driver_version=data.get("driverVersion"),
            gpus=tuple(GpuInfo.from_dict(g) for g in gpus if isinstance(g, dict)),
        )


def host_facts(*, with_gpus: bool = True) -> HostFacts:
    mem = meminfo()
    gpus = gpu_facts() if with_gpus else None
    return HostFacts(
        hostname=socket.gethostname(),
        arch=platform.machine(),
        kernel=os.uname().release,
        glibc=glibc_version(),
        mem_total_bytes=mem.get("MemTotal", 0),
        mem_available_bytes=mem.get("MemAvailable", 0),
        driver_version=gpus.driver_version if gpus else None,
        gpus=gpus.gpus if gpus else (),
    )
