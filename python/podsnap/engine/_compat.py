"""Gates checked before a restore: this host must be able to run what the manifest captured.

Each gate compares the manifest's source facts with this host's; the first refusal raises
`CompatibilityError(gate, expected, found)`. Only an explicit `skip_compat=True` bypasses them (the
digest check is not a gate and is never skipped by it).

  arch          CPU architecture, exact (x86_64 pages do not run on aarch64)
  kernel        kernel release, exact (CRIU images depend on vDSO layout and kernel features)
  driver        NVIDIA driver version, exact, when CUDA state was captured
  gpu-model     product name of every GPU the source used, present here
  gpu-count     at least as many GPUs as the source used
  memory        MemAvailable >= the dumped pages (GPU memory included) plus a margin
  memory-limit  the destination container's memory limit (when the caller knows it) >= the same
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from podsnap.engine._host import HostFacts
from podsnap.engine._manifest import Manifest
from podsnap.engine.errors import CompatibilityError

#: headroom for CRIU itself and the page cache it needs while restoring
MEMORY_MARGIN_BYTES: int = 64 << 20


@dataclass(frozen=True)
class GateFailure:
    gate: str
    expected: object
    found: object
    hint: str = ""

    def error(self) -> CompatibilityError:
        return CompatibilityError(self.gate, self.expected, self.found, self.hint)


def check(manifest: Manifest, host: HostFacts, *, memory_limit_bytes: int | None = None) -> list[GateFailure]:
    """Every gate that refuses this host (empty when the restore may proceed)."""
    src = manifest.source
    out: list[GateFailure] = []
    if src.arch != host.arch:
        out.append(GateFailure("arch", src.arch, host.arch))
    if src.kernel != host.kernel:
        out.append(GateFailure("kernel", src.kernel, host.kernel, "restore on a node with the source's kernel"))
    if manifest.cuda_pids:
        if src.driver_version != host.driver_version:
            hint = (
                "restore on a node with the same driver"
                if host.driver_version
                else "no driver seen here: NVML missing (pip install 'podsnap[gpu]') or no NVIDIA driver"
            )
            out.append(GateFailure("driver", src.driver_version, host.driver_version, hint))
        want = Counter(manifest.cuda_gpu_names)
        have = Counter(g.name for g in host.gpus)
        if sum(want.values()) > sum(have.values()):
            out.append(GateFailure("gpu-count", sum(want.values()), sum(have.values())))
        elif any(have[name] < n for name, n in want.items()):
            out.append(GateFailure("gpu-model", sorted(want.elements()), sorted(have.elements())))
    need = manifest.memory_bytes + MEMORY_MARGIN_BYTES
    if host.mem_available_bytes < need:
        out.append(
            GateFailure("memory", f">= {need} bytes available", f"{host.mem_available_bytes} bytes", "free host memory")
        )
    if memory_limit_bytes is not None and memory_limit_bytes < need:
        out.append(
            GateFailure(
                "memory-limit",
                f">= {need} bytes",
                f"{memory_limit_bytes} bytes",
                "raise the restore container's memory limit to at least the source's",
            )
        )
    return out


def enforce(
    manifest: Manifest, host: HostFacts, *, skip: bool = False, memory_limit_bytes: int | None = None
) -> list[GateFailure]:
    """Raise the first gate's CompatibilityError unless `skip`; return the failures (all skipped ones too)."""
    failures = check(manifest, host, memory_limit_bytes=memory_limit_bytes)
    if failures and not skip:
        raise failures[0].error()
    return failures
