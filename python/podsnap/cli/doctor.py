"""`podsnap doctor`: what this host can and cannot do for checkpoint/restore, each line with its fix."""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import re
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

Status = Literal["OK", "WARN", "FAIL"]

CAP_SYS_ADMIN = 21
CAP_CHECKPOINT_RESTORE = 40
#: first driver branch with the CUDA checkpoint driver API (r550 had only the cuda-checkpoint utility)
MIN_CHECKPOINT_DRIVER = 570


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""


def check_kernel() -> Check:
    release = os.uname().release
    m = re.match(r"(\d+)\.(\d+)", release)
    version = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    if version < (3, 11):
        return Check("kernel", "FAIL", release, "CRIU needs Linux >= 3.11")
    if version < (5, 4):
        return Check("kernel", "WARN", release, "use Linux >= 5.4 (clone3 set_tid, pidfd) for reliable restores")
    return Check("kernel", "OK", release)


def check_criu() -> list[Check]:
    from podsnap.engine import Criu, CriuError, find_binary

    try:
        criu = Criu(find_binary())
        version = criu.version()
    except CriuError as exc:
        return [Check("criu", "FAIL", str(exc).splitlines()[0], "run `make setup` (builds CRIU 4) or set PODSNAP_CRIU")]
    out = [Check("criu", "OK", f"CRIU {version} at {criu.binary.exe}")]
    if os.geteuid() != 0:
        return [*out, Check("criu check", "WARN", "skipped: not root", "run `sudo podsnap doctor`")]
    try:
        ok, text = criu.check()
    except OSError as exc:
        return [*out, Check("criu check", "FAIL", str(exc), "run `make setup`")]
    if ok:
        return [*out, Check("criu check", "OK", "Looks good.")]
    first = next((ln for ln in text.splitlines() if "Error" in ln), text.splitlines()[-1] if text else "no output")
    return [*out, Check("criu check", "WARN", first[:200], "see `criu check --all`; a missing feature may break dumps")]


def _cap_eff() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def check_caps() -> list[Check]:
    caps = _cap_eff()
    sys_admin = bool(caps >> CAP_SYS_ADMIN & 1)
    cr = bool(caps >> CAP_CHECKPOINT_RESTORE & 1)
    fix = "run as root (the node agent runs privileged)"
    return [
        Check(
            "CAP_SYS_ADMIN",
            "OK" if sys_admin else "FAIL",
            "effective" if sys_admin else "missing",
            "" if sys_admin else fix,
        ),
        Check(
            "CAP_CHECKPOINT_RESTORE",
            "OK" if cr else ("WARN" if sys_admin else "FAIL"),
            "effective" if cr else "missing",
            "" if cr else "kernel >= 5.9 and a privileged process; CAP_SYS_ADMIN covers it",
        ),
    ]


def check_cuda() -> list[Check]:
    from podsnap.engine import host_facts

    if not Path("/dev/nvidiactl").exists():
        return [Check("nvidia driver", "WARN", "no NVIDIA driver (/dev/nvidiactl missing): CPU-only captures", "")]
    facts = host_facts(with_gpus=True)
    if facts.driver_version is None:
        return [Check("nvidia driver", "WARN", "NVML did not answer (no nvidia-ml-py?)", "pip install 'podsnap[gpu]'")]
    names = ", ".join(sorted({g.name for g in facts.gpus})) or "no GPUs"
    mig = [g.index for g in facts.gpus if g.mig_mode]
    major = int(facts.driver_version.split(".")[0])
    out = [
        Check(
            "nvidia driver",
            "OK" if major >= MIN_CHECKPOINT_DRIVER else "FAIL",
            f"{facts.driver_version}; {len(facts.gpus)} GPU(s): {names}" + (f"; MIG on GPU {mig}" if mig else ""),
            ""
            if major >= MIN_CHECKPOINT_DRIVER
            else f"install driver >= {MIN_CHECKPOINT_DRIVER} for the checkpoint API",
        )
    ]
    try:
        from cuda.bindings import driver
    except ImportError:
        return [*out, Check("cuda checkpoint API", "FAIL", "cuda-bindings not installed", "pip install 'podsnap[gpu]'")]
    if not hasattr(driver, "cuCheckpointProcessLock"):
        return [
            *out,
            Check("cuda checkpoint API", "FAIL", "bindings lack cuCheckpoint*", "pip install 'cuda-bindings>=12.8'"),
        ]
    try:
        err = driver.cuInit(0)[0]
    except Exception as exc:  # the bindings raise when libcuda cannot be loaded
        return [*out, Check("cuda checkpoint API", "FAIL", f"cuInit: {exc}", "check the driver installation")]
    if int(err) != 0:
        return [*out, Check("cuda checkpoint API", "FAIL", f"cuInit failed: {err}", "check the driver installation")]
    remap = (
        "with GPU remapping"
        if hasattr(driver, "CUcheckpointGpuPair")
        else "without GPU remapping (CUDA 13 bindings add it)"
    )
    return [*out, Check("cuda checkpoint API", "OK", f"cuCheckpointProcess* present, {remap}")]


#: measured on the H200 with 8 GiB of weights, THP always vs madvise (bench/NOTES.md, run 4)
THP_GAINS = "CUDA checkpoint -34%, CRIU dump -42%, CRIU restore -41%, CUDA restore -17%"


def check_thp(path: Path = Path("/sys/kernel/mm/transparent_hugepage/enabled")) -> Check:
    """Transparent huge pages: `always` makes every phase of a capture and a restore faster."""
    try:
        text = path.read_text().strip()
    except OSError:
        return Check("transparent hugepages", "WARN", f"cannot read {path}", "")
    mode = re.search(r"\[(\w+)\]", text)
    current = mode.group(1) if mode else text
    if current == "always":
        return Check("transparent hugepages", "OK", f"always ({THP_GAINS} measured against madvise)")
    return Check(
        "transparent hugepages",
        "WARN",
        f"{current}: captures and restores run slower than they could",
        f"echo always > {path} (on the H200 with 8 GiB of weights: {THP_GAINS}); "
        "add transparent_hugepage=always to the kernel command line to keep it",
    )


#: a first write this much slower than a second one means the hypervisor backs guest RAM on first write
FIRST_WRITE_SLOWDOWN = 2.0


def write_fresh_memory(mib: int = 512) -> float:
    """GiB/s of writing `mib` of fresh anonymous memory (huge pages advised, as the restore's fill does)."""
    size = mib << 20
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        region.madvise(mmap.MADV_HUGEPAGE)
        buf = ctypes.c_char.from_buffer(region)
        t0 = time.perf_counter()
        ctypes.memset(ctypes.addressof(buf), 1, size)
        elapsed = time.perf_counter() - t0
        del buf  # the buffer export must end before the mapping can be closed
    finally:
        region.close()
    return (size / (1 << 30)) / max(elapsed, 1e-9)


def check_first_write(measure: Callable[[], float] = write_fresh_memory) -> Check:
    """A restore writes the whole checkpointed memory into fresh pages. On a VM whose RAM the hypervisor
    backs only when the guest first writes it, a node's first restores pay for that (bench/NOTES.md: on the
    H200 VM fresh memory was written at 10 GiB/s the first time and 31-35 once written before, and the first
    8 GiB restore took 5.13 s instead of 2.7). Measured here: the same size written twice, the second time
    into the pages the first freed."""
    first, again = measure(), measure()
    detail = f"fresh memory written at {first:.1f} GiB/s, {again:.1f} GiB/s the second time"
    if again >= FIRST_WRITE_SLOWDOWN * first:
        return Check(
            "first write of memory",
            "WARN",
            f"{detail}: RAM backed on first write (a VM?); this node's first restores will be slower",
            "preallocate the guest's memory in the hypervisor (no ballooning or free page reporting) on GPU "
            "node pools where restore latency matters; see docs/troubleshooting.md",
        )
    return Check("first write of memory", "OK", detail)


def check_openat2() -> Check:
    """The agent writes into containers' control dirs only through openat2 (no symlink can redirect it)."""
    from podsnap.controldir import OPENAT2_KERNEL, openat2_available

    if openat2_available():
        return Check("openat2", "OK", "available: control-dir writes into containers resolve inside their root")
    return Check(
        "openat2",
        "FAIL",
        "unavailable (old kernel or a seccomp filter): the agent refuses to write into a container's control dir",
        f"{OPENAT2_KERNEL}, and no seccomp profile denying openat2 for the agent",
    )


def check_io_uring() -> Check:
    path = Path("/proc/sys/kernel/io_uring_disabled")
    try:
        value = path.read_text().strip()
    except OSError:
        return Check(
            "io_uring", "WARN", "cannot tell (no kernel.io_uring_disabled)", "make sure workers do not use io_uring"
        )
    if value == "2":
        return Check("io_uring", "OK", "disabled (2)")
    return Check(
        "io_uring",
        "WARN",
        f"enabled ({value}): CRIU cannot dump a process that uses io_uring",
        "sysctl kernel.io_uring_disabled=2, or keep workers off io_uring",
    )


def check_tools() -> Check:
    missing = [t for t in ("nsenter", "setsid") if shutil.which(t) is None]
    if missing:
        return Check(
            "util-linux", "WARN", f"missing {', '.join(missing)}", "apt-get install util-linux (namespace mode)"
        )
    return Check("util-linux", "OK", "nsenter, setsid")


def all_checks() -> list[Check]:
    return [
        check_kernel(),
        *check_criu(),
        *check_caps(),
        *check_cuda(),
        check_thp(),
        check_first_write(),
        check_openat2(),
        check_io_uring(),
        check_tools(),
    ]


def run_doctor(json_path: str | None = None) -> int:
    checks = all_checks()
    for c in checks:
        print(f"{c.status:<5}{c.name:<24}{c.detail}")
        if c.fix and c.status != "OK":
            print(f"{'':<29}fix: {c.fix}")
    failed = [c for c in checks if c.status == "FAIL"]
    print(f"\n{'FAIL' if failed else 'OK'}: {len(failed)} failing, {sum(c.status == 'WARN' for c in checks)} warnings")
    if json_path:
        Path(json_path).write_text(json.dumps([asdict(c) for c in checks], indent=2) + "\n")
    sys.stdout.flush()
    return 1 if failed else 0
