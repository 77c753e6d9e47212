"""Probe, on the GPU, what the cooperative weight path relies on (one run, < 3 min on the H200).

A "subject" process (torch + cuda.bindings, started detached) prepares, then offers itself for capture
through the control dir; this script captures and restores it with the engine (host mode), signals
`restore-complete`, and collects what the subject measured before and after. Questions answered
(keys of the JSON):

  pinned       does pinned host memory (torch pin_memory = cudaHostAlloc through torch's caching host
               allocator, cuMemHostAlloc, and cuMemHostRegister of an mmap) survive CUDA lock/checkpoint +
               criu dump + criu restore + CUDA restore/unlock: still registered with the driver
               (cuPointerGetAttribute), still copying at pinned speed, and correct?
  vmm          does a CUDA VMM range (cuMemAddressReserve) whose physical memory was unmapped and
               released before the checkpoint survive, and can it be re-mapped at the same address
               after the restore (data correct, a CUDA graph captured on it replays, and reads the new
               memory)? How long do cuMemCreate + cuMemMap of the whole range take before and after?
  alloc        how long cuMemHostRegister of 8 GiB and cuMemHostAlloc / pin_memory of 16 x 64 MiB take
  engine       capture/restore phase timings with ~1 GiB of ordinary GPU memory left in the process
               (cuda_checkpoint, cuda_restore: the CUDA restore's cost when the weights are gone)

usage (on the device, root, CRIU from PODSNAP_CRIU or .device/criu/criu.sh, a python3 with torch and
cuda-bindings; re-executes itself with one if needed):
    python3 bench/probe_cooperative.py [--vmm-gib 8] [--register-gib 8]
JSON: $OUT/probe_cooperative.json (else bench/results/), plus the subject's log.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))

MIB = 1 << 20
GIB = 1 << 30
PROT_RW = 0x1 | 0x2
MAP_PRIVATE_ANON = 0x02 | 0x20


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


def anon_map(nbytes: int) -> int:
    ptr = _libc().mmap(None, nbytes, PROT_RW, MAP_PRIVATE_ANON, -1, 0)
    if ptr in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), f"mmap of {nbytes} bytes failed")
    return int(ptr)


def anon_unmap(ptr: int, nbytes: int) -> None:
    if _libc().munmap(ptr, nbytes) != 0:
        raise OSError(ctypes.get_errno(), "munmap failed")


def _has_gpu_python(python: str) -> bool:
    p = subprocess.run([python, "-c", "import torch, cuda.bindings.driver"], capture_output=True, check=False)
    return p.returncode == 0


def _reexec_with_gpu_python() -> None:
    """The repo's venv has no torch: run again under a python3 that has torch and cuda-bindings."""
    try:
        import cuda.bindings.driver  # noqa: F401
        import torch  # noqa: F401

        return
    except ImportError:
        pass
    for cand in (os.environ.get("PYTHON", ""), "/usr/bin/python3", "/usr/local/bin/python3", shutil.which("python3")):
        if cand and os.path.realpath(cand) != os.path.realpath(sys.executable) and _has_gpu_python(cand):
            os.execv(cand, [cand, *sys.argv])
    raise SystemExit("probe_cooperative: no python3 with torch and cuda-bindings found; set PYTHON=")


# --- the subject ------------------------------------------------------------------------------


class Subject:
    """Runs inside the captured process. Every step records its result or its error, never stops the run."""

    def __init__(self, work: Path, parts: set[str], vmm_gib: int, register_gib: int) -> None:
        import torch
        from cuda.bindings import driver as cu

        self.torch = torch
        self.cu = cu
        self.work = work
        self.parts = parts
        self.pinned: list[Any] = []
        self.hostalloc: list[int] = []
        self.registered_ptr = 0
        self.vmm_bytes = vmm_gib * GIB
        self.register_bytes = register_gib * GIB
        self.res: dict[str, Any] = {"errors": {}}
        torch.cuda.init()
        self.dev = torch.device("cuda", torch.cuda.current_device())
        torch.empty(1, device=self.dev)  # the primary context exists and is current on this thread
        self.ok(cu.cuInit(0))
        self.ordinal = self.dev.index or 0

    # helpers
    def ok(self, ret: Any) -> Any:
        err = ret[0] if isinstance(ret, tuple) else ret
        if int(err) != 0:
            raise RuntimeError(f"CUDA driver error {err!r}")
        if isinstance(ret, tuple):
            return ret[1] if len(ret) == 2 else ret[1:]
        return None

    def step(self, name: str, fn: Callable[[], Any]) -> Any:
        t0 = time.monotonic()
        try:
            out = fn()
        except Exception as e:
            self.res["errors"][name] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
            return None
        self.res.setdefault("step_s", {})[name] = round(time.monotonic() - t0, 4)
        return out

    def pattern(self, nbytes: int, seed: int) -> Any:
        torch = self.torch
        g = torch.Generator(device=self.dev).manual_seed(seed)
        return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=self.dev, generator=g)

    def h2d_gbps(self, host_tensors: list[Any], dst: Any) -> float:
        """Copy the host tensors back to back into `dst` (uint8, large enough); GB/s by CUDA events."""
        torch = self.torch
        stream = torch.cuda.Stream()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        total = 0
        with torch.cuda.stream(stream):
            start.record(stream)
            for h in host_tensors:
                n = h.numel()
                dst[total : total + n].copy_(h, non_blocking=True)
                total += n
            end.record(stream)
        end.synchronize()
        return total / (start.elapsed_time(end) / 1000) / 1e9

    def memory_type(self, ptr: int) -> str:
        cu = self.cu
        err, value = cu.cuPointerGetAttribute(cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr)
        if int(err) != 0:
            return f"not known to the driver ({err!r})"
        return str(value)

    def host_tensor(self, ptr: int, nbytes: int) -> Any:
        """A CPU uint8 tensor over raw host memory (no copy)."""
        torch = self.torch
        buf = (ctypes.c_uint8 * nbytes).from_address(ptr)
        return torch.frombuffer(buf, dtype=torch.uint8)

    def device_tensor(self, ptr: int, nbytes: int) -> Any:
        """A CUDA uint8 tensor over raw device memory (no copy), through __cuda_array_interface__."""
        torch = self.torch

        class _Array:
            __cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 2}

        return torch.as_tensor(_Array(), device=self.dev)

    # before the capture
    def prepare(self) -> None:
        torch = self.torch
        r = self.res
        self.dst = torch.empty(GIB, dtype=torch.uint8, device=self.dev)  # ~1 GiB left in the checkpoint
        self.dst.copy_(self.pattern(GIB, 400))
        if "pinned" in self.parts:
            self.prepare_pinned()
        else:  # staging for the copies into the VMM range
            self.pinned = [torch.empty(64 * MIB, dtype=torch.uint8, pin_memory=True) for _ in range(16)]
        if "vmm" in self.parts:
            self.step("vmm_setup", self.vmm_setup)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # freed temporaries would otherwise be carried by the checkpoint
        free, total = torch.cuda.mem_get_info()
        r["gpu_free_before_checkpoint"] = free
        r["gpu_total"] = total
        r["torch_allocated_bytes"] = torch.cuda.memory_allocated()
        r["torch_reserved_bytes"] = torch.cuda.memory_reserved()

    def prepare_pinned(self) -> None:
        torch, cu = self.torch, self.cu
        r = self.res

        # -- allocation costs
        def pin16() -> list[Any]:
            t0 = time.monotonic()
            bufs = [torch.empty(64 * MIB, dtype=torch.uint8, pin_memory=True) for _ in range(16)]
            r["alloc_pin_memory_16x64MiB_s"] = time.monotonic() - t0
            return bufs

        self.pinned = self.step("pin_memory_16x64MiB", pin16) or []

        def hostalloc16() -> list[int]:
            t0 = time.monotonic()
            ptrs = [int(self.ok(cu.cuMemHostAlloc(64 * MIB, 0))) for _ in range(16)]
            r["alloc_cuMemHostAlloc_16x64MiB_s"] = time.monotonic() - t0
            return ptrs

        self.hostalloc = self.step("cuMemHostAlloc_16x64MiB", hostalloc16) or []

        def register_big() -> None:
            ptr = anon_map(self.register_bytes)
            try:
                t0 = time.monotonic()
                self.ok(cu.cuMemHostRegister(ptr, self.register_bytes, 0))
                r["alloc_cuMemHostRegister_untouched_s"] = time.monotonic() - t0
                r["register_bytes"] = self.register_bytes
                t0 = time.monotonic()
                self.ok(cu.cuMemHostUnregister(ptr))
                r["alloc_cuMemHostUnregister_s"] = time.monotonic() - t0
                # the same range again, now that its pages exist (a buffer registered after it was filled)
                t0 = time.monotonic()
                self.ok(cu.cuMemHostRegister(ptr, self.register_bytes, 0))
                r["alloc_cuMemHostRegister_touched_s"] = time.monotonic() - t0
                self.ok(cu.cuMemHostUnregister(ptr))
            finally:
                anon_unmap(ptr, self.register_bytes)  # no GiBs of it in the image
            # a small registered range is kept across the checkpoint
            self.registered_ptr = anon_map(256 * MIB)
            self.ok(cu.cuMemHostRegister(self.registered_ptr, 256 * MIB, 0))

        self.step("cuMemHostRegister_big", register_big)

        # -- patterns in every kind of pinned memory
        def fill_pinned() -> None:
            for i, b in enumerate(self.pinned):
                b.copy_(self.pattern(64 * MIB, 100 + i))
            for i, p in enumerate(self.hostalloc):
                self.host_tensor(p, 64 * MIB).copy_(self.pattern(64 * MIB, 200 + i))
            if self.registered_ptr:
                self.host_tensor(self.registered_ptr, 256 * MIB).copy_(self.pattern(256 * MIB, 300))
            torch.cuda.synchronize()

        self.step("fill_pinned", fill_pinned)
        r["before_pinned"] = self.step("pinned_before", self.pinned_report)

        def pageable() -> float:
            host = torch.empty(GIB, dtype=torch.uint8)
            host.fill_(1)
            gbps = self.h2d_gbps([host], self.dst)
            self.dst.copy_(self.pattern(GIB, 400))
            return gbps

        r["pageable_h2d_GBps_before"] = self.step("pageable_h2d", pageable)

    def pinned_report(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        torch = self.torch
        if self.pinned:
            out["pin_memory_type"] = self.memory_type(self.pinned[0].data_ptr())
            out["pin_memory_is_pinned_torch"] = bool(self.pinned[0].is_pinned())
            out["pin_memory_h2d_GBps"] = self.h2d_gbps(self.pinned, self.dst)
            out["pin_memory_correct"] = all(
                torch.equal(self.dst[i * 64 * MIB : (i + 1) * 64 * MIB], self.pattern(64 * MIB, 100 + i))
                for i in range(len(self.pinned))
            )
        if self.hostalloc:
            views = [self.host_tensor(p, 64 * MIB) for p in self.hostalloc]
            out["cuMemHostAlloc_type"] = self.memory_type(self.hostalloc[0])
            out["cuMemHostAlloc_h2d_GBps"] = self.h2d_gbps(views, self.dst)
            out["cuMemHostAlloc_correct"] = all(
                torch.equal(self.dst[i * 64 * MIB : (i + 1) * 64 * MIB], self.pattern(64 * MIB, 200 + i))
                for i in range(len(views))
            )
        if self.registered_ptr:
            view = self.host_tensor(self.registered_ptr, 256 * MIB)
            out["registered_type"] = self.memory_type(self.registered_ptr)
            out["registered_h2d_GBps"] = self.h2d_gbps([view], self.dst)
            out["registered_correct"] = bool(torch.equal(self.dst[: 256 * MIB], self.pattern(256 * MIB, 300)))
        self.dst.copy_(self.pattern(GIB, 400))
        torch.cuda.synchronize()
        return out

    def vmm_prop(self) -> Any:
        cu = self.cu
        prop = cu.CUmemAllocationProp()
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = self.ordinal
        return prop

    def vmm_map(self) -> float:
        """cuMemCreate + cuMemMap + cuMemSetAccess of the whole range in 512 MiB handles; seconds."""
        cu = self.cu
        t0 = time.monotonic()
        self.handles = []
        for off in range(0, self.vmm_bytes, self.vmm_chunk):
            h = self.ok(cu.cuMemCreate(self.vmm_chunk, self.vmm_prop(), 0))
            self.ok(cu.cuMemMap(self.vmm_ptr + off, self.vmm_chunk, 0, h, 0))
            self.handles.append(h)
        desc = cu.CUmemAccessDesc()
        desc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        desc.location.id = self.ordinal
        desc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self.ok(cu.cuMemSetAccess(self.vmm_ptr, self.vmm_bytes, [desc], 1))
        return time.monotonic() - t0

    def vmm_unmap(self) -> float:
        cu = self.cu
        t0 = time.monotonic()
        for i, h in enumerate(self.handles):
            self.ok(cu.cuMemUnmap(self.vmm_ptr + i * self.vmm_chunk, self.vmm_chunk))
            self.ok(cu.cuMemRelease(h))
        self.handles = []
        return time.monotonic() - t0

    def graph_sum(self) -> int:
        self.graph.replay()
        self.torch.cuda.synchronize()
        return int(self.graph_out.item())

    def vmm_setup(self) -> None:
        torch, cu = self.torch, self.cu
        r = self.res
        gran = int(
            self.ok(
                cu.cuMemGetAllocationGranularity(
                    self.vmm_prop(), cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
                )
            )
        )
        self.vmm_chunk = max(gran, 512 * MIB // gran * gran)
        self.vmm_bytes = (self.vmm_bytes + self.vmm_chunk - 1) // self.vmm_chunk * self.vmm_chunk
        self.vmm_ptr = int(self.ok(cu.cuMemAddressReserve(self.vmm_bytes, 0, 0, 0)))
        r["vmm"] = {"granularity": gran, "chunk": self.vmm_chunk, "bytes": self.vmm_bytes, "address": hex(self.vmm_ptr)}
        r["vmm"]["map_s_before"] = self.vmm_map()
        self.vmm_t = self.device_tensor(self.vmm_ptr, self.vmm_bytes)
        self.vmm_t[: 512 * MIB].copy_(self.pattern(512 * MIB, 500))
        region = self.vmm_t[: 512 * MIB].view(torch.int16)
        self.graph_out = torch.zeros(1, dtype=torch.int64, device=self.dev)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.graph_out.copy_(region.sum(dtype=torch.int64).view(1))
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.graph_out.copy_(region.sum(dtype=torch.int64).view(1))
        r["vmm"]["graph_sum_before"] = self.graph_sum()
        r["vmm"]["eager_sum_before"] = int(region.sum(dtype=torch.int64).item())
        if self.pinned:
            r["vmm"]["h2d_into_vmm_GBps"] = self.h2d_gbps(self.pinned, self.vmm_t[512 * MIB :])
        torch.cuda.synchronize()
        r["vmm"]["unmap_release_s"] = self.vmm_unmap()

    # after the restore
    def after(self) -> None:
        # first: the later steps use dst as a copy target
        self.res["dst_intact"] = bool(self.torch.equal(self.dst, self.pattern(GIB, 400)))
        if "pinned" in self.parts:
            self.after_pinned()
        if "vmm" in self.parts:
            self.after_vmm()

    def after_pinned(self) -> None:
        torch = self.torch
        r = self.res
        r["after_pinned"] = self.step("pinned_after", self.pinned_report)

        def fresh_pin() -> dict[str, float]:
            t0 = time.monotonic()
            bufs = [torch.empty(64 * MIB, dtype=torch.uint8).pin_memory() for _ in range(16)]
            took = time.monotonic() - t0
            return {"alloc_s": took, "h2d_GBps": self.h2d_gbps(bufs, self.dst)}

        r["fresh_pin_memory_after"] = self.step("fresh_pin_after", fresh_pin)

    def after_vmm(self) -> None:
        torch, cu = self.torch, self.cu
        r = self.res
        vm: dict[str, Any] = {}
        r["vmm_after"] = vm

        def remap() -> None:
            vm["map_s_after"] = self.vmm_map()
            vm["same_address"] = True

        if self.step("vmm_remap_same_address", remap) is None and "vmm_remap_same_address" in r["errors"]:
            vm["same_address"] = False

            # is the reservation gone? try to reserve the same range again with it as a hint
            def reserve_again() -> None:
                got = int(self.ok(cu.cuMemAddressReserve(self.vmm_bytes, 0, self.vmm_ptr, 0)))
                vm["reserve_again_address"] = hex(got)
                vm["reserve_again_same"] = got == self.vmm_ptr

            self.step("vmm_reserve_again", reserve_again)
            return
        self.vmm_t[: 512 * MIB].copy_(self.pattern(512 * MIB, 500))
        torch.cuda.synchronize()
        vm["graph_sum_after"] = self.step("vmm_graph_replay", self.graph_sum)
        vm["graph_replays_same"] = vm["graph_sum_after"] == r.get("vmm", {}).get("graph_sum_before")
        # the graph must read the NEW memory: change the data, replay, compare with an eager sum
        self.vmm_t[: 512 * MIB].copy_(self.pattern(512 * MIB, 501))
        eager = int(self.vmm_t[: 512 * MIB].view(torch.int16).sum(dtype=torch.int64).item())
        vm["graph_reads_new_memory"] = self.step("vmm_graph_replay_2", self.graph_sum) == eager
        if self.pinned:
            vm["h2d_into_vmm_GBps_after"] = self.step(
                "vmm_h2d_after", lambda: self.h2d_gbps(self.pinned, self.vmm_t[512 * MIB :])
            )


def run_subject(work: Path, parts: set[str], vmm_gib: int, register_gib: int) -> int:
    from podsnap.workload import SnapshotControl

    s = Subject(work, parts, vmm_gib, register_gib)
    s.step("prepare", s.prepare)
    (work / "before.json").write_text(json.dumps(s.res, indent=1, default=str))
    info = SnapshotControl().checkpoint_and_wait(timeout_s=600)
    s.res["restored"] = info.restored
    s.step("after", s.after)
    (work / "after.json").write_text(json.dumps(s.res, indent=1, default=str))
    return 0


# --- the driver -------------------------------------------------------------------------------


def run_one(part: str, a: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """One subject doing `part` (pinned | vmm), captured and restored; its before/after measurements."""
    from podsnap import contract
    from podsnap.controldir import ControlDir
    from podsnap.demo._roundtrip import start_detached, stop_worker
    from podsnap.engine import CaptureOptions, EngineError, RestoreOptions, capture, restore

    work = a.work / part
    shutil.rmtree(work, ignore_errors=True)
    (work / "control").mkdir(parents=True)
    ctl = ControlDir(work / "control")
    env = {**os.environ, contract.ENV_CONTROL_DIR: str(work / "control"), "PYTHONPATH": str(REPO / "python")}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--subject", part, "--work", str(work)]
    cmd += ["--vmm-gib", str(a.vmm_gib), "--register-gib", str(a.register_gib)]
    run: dict[str, Any] = {"part": part}
    pid: int | None = None
    log = work / "worker.log"

    def alive(_: float) -> None:
        if pid is not None and not Path(f"/proc/{pid}").exists():
            raise RuntimeError(f"the subject (pid {pid}) exited; see probe_cooperative-{part}.log")

    t0 = time.monotonic()
    try:
        pid, log = start_detached(cmd, work, env)
        ctl.wait_for(contract.FILE_READY_FOR_SNAPSHOT, timeout_s=150, on_poll=alive)
        run["before"] = json.loads((work / "before.json").read_text())
        cap = capture(pid, work / "artifact", CaptureOptions())
        run["engine_capture"] = {"timings_ms": cap.timings_ms, "bytes_memory": cap.bytes_memory}
        res = restore(work / "artifact", RestoreOptions())
        pid = res.pid
        run["engine_restore"] = {"timings_ms": res.timings_ms, "bytes_total": res.bytes_total}
        ctl.signal_restored({})
        ControlDir(work).wait_for("after.json", timeout_s=150, on_poll=alive)
        run["after"] = json.loads((work / "after.json").read_text())
        run["ok"] = True
    except (EngineError, RuntimeError, OSError) as e:
        run["ok"] = False
        run["error"] = f"{type(e).__name__}: {e}"[:4000]
        traceback.print_exc()
    finally:
        run["elapsed_s"] = round(time.monotonic() - t0, 2)
        if pid is not None:
            stop_worker(pid)
        with contextlib.suppress(OSError):
            shutil.copy(log, out_dir / f"probe_cooperative-{part}.log")
        shutil.rmtree(work, ignore_errors=True)
    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--parts", default="pinned,vmm", help="which subjects to run: pinned, vmm (one process each)")
    ap.add_argument("--vmm-gib", type=int, default=8, help="size of the VMM range released and re-mapped")
    ap.add_argument("--register-gib", type=int, default=8, help="size of the cuMemHostRegister timing")
    ap.add_argument("--work", type=Path, default=Path("/dev/shm/podsnap-probe"), help="scratch dir")
    ap.add_argument("--subject", choices=("pinned", "vmm"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    _reexec_with_gpu_python()
    if a.subject:
        return run_subject(a.work, {a.subject}, a.vmm_gib, a.register_gib)

    if not os.environ.get("PODSNAP_CRIU") and (REPO / ".device/criu/criu.sh").exists():
        os.environ["PODSNAP_CRIU"] = str(REPO / ".device/criu/criu.sh")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else REPO / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / "probe_cooperative.json"
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    doc: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "kernel": platform.release(),
        "thp": thp.read_text().strip() if thp.exists() else None,
        "gpu": subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip(),
        "runs": {},
    }
    t_start = time.monotonic()
    for part in [p for p in a.parts.split(",") if p]:
        doc["runs"][part] = run_one(part, a, out_dir)
        doc["elapsed_s"] = round(time.monotonic() - t_start, 2)
        doc["summary"] = summary(doc)
        out.write_text(json.dumps(doc, indent=1, default=str))
    shutil.rmtree(a.work, ignore_errors=True)
    print(json.dumps(doc.get("summary"), indent=1, default=str))
    print(f"JSON: {out}")
    return 0 if all(r.get("ok") for r in doc["runs"].values()) else 1


def summary(doc: dict[str, Any]) -> dict[str, Any]:
    """The answers, one line each (the JSON has the details)."""
    out: dict[str, Any] = {}
    for part, run in doc["runs"].items():
        b, a = run.get("before") or {}, run.get("after") or {}
        ct = (run.get("engine_capture") or {}).get("timings_ms") or {}
        rt = (run.get("engine_restore") or {}).get("timings_ms") or {}
        s: dict[str, Any] = {
            "ok": run.get("ok"),
            "error": run.get("error"),
            "gpu_used_before_checkpoint": (b.get("gpu_total") or 0) - (b.get("gpu_free_before_checkpoint") or 0),
            "cuda_checkpoint_ms": ct.get("cuda_checkpoint"),
            "criu_dump_ms": ct.get("criu_dump"),
            "criu_restore_ms": rt.get("criu_restore"),
            "cuda_restore_ms": rt.get("cuda_restore"),
            "ordinary_gpu_memory_intact": a.get("dst_intact"),
            "errors": {**(b.get("errors") or {}), **(a.get("errors") or {})},
        }
        if part == "pinned":
            bp, ap = b.get("before_pinned") or {}, a.get("after_pinned") or {}
            s["pinned_survives"] = {
                k: {
                    "type_before_after": (bp.get(f"{k}_type"), ap.get(f"{k}_type")),
                    "GBps_before_after": (bp.get(f"{k}_h2d_GBps"), ap.get(f"{k}_h2d_GBps")),
                    "correct_after": ap.get(f"{k}_correct"),
                }
                for k in ("pin_memory", "cuMemHostAlloc", "registered")
            }
            s["pageable_GBps"] = b.get("pageable_h2d_GBps_before")
            s["fresh_pin_after"] = a.get("fresh_pin_memory_after")
            s["alloc_s"] = {k: v for k, v in b.items() if k.startswith("alloc_")}
        if part == "vmm":
            s["vmm"] = {**(b.get("vmm") or {}), **(a.get("vmm_after") or {})}
        out[part] = s
    return out


if __name__ == "__main__":
    raise SystemExit(main())
