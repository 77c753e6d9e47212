"""The transparent fast restore against CRIU's own page restore, on any Linux host (no GPU), real CRIU.

A worker holds SIZE GiB of random bytes in one anonymous mapping (what a CUDA checkpoint leaves in a
worker's host memory). For each mode, ROUNDS times: capture it, restore it, check the region's sha256:
  criu      `fast_restore` off: CRIU keeps every page (schema 1)
  fast      the region goes to a raw bulk file (schema 2), its mapping advised MADV_HUGEPAGE
  fast-4k   the same without the huge-page advice (`bulk_hugepages=False`)
  verified  `fast`, restored with `verified_digests` (a node-local copy checked when cached: no hashing)
  verified-4k  `fast-4k`, restored with `verified_digests`
Modes run interleaved, round by round, so a change in the machine's load hits all of them alike.
Prints the median of each phase and the CPU seconds the restore used (ours, CRIU's, and the restored
task's, inside which CRIU's restorer copies the pages: on a busy machine wall times follow the load,
CPU seconds much less); writes JSON to $OUT/fill-cpu.json when OUT is set.

`--primitives` compares the ways to write bytes into a stopped process instead, without CRIU: a child
maps SIZE GiB (MADV_HUGEPAGE or MADV_NOHUGEPAGE) and stops; the bytes come from a page-cached file,
  mmap-mem       hashed from a mapping of the file, written with pwrite on /proc/PID/mem (the fill before
                 2026-12-01)
  mmap-pvw       hashed from the mapping, written with process_vm_writev
  buf-pvw        preadv into a private 1 MiB buffer, hashed there, written from it (the fill now)
  copy-pvw       the same, the buffer filled by a copy from the mapping instead of preadv
  ...-nohash     the same without sha256 (what `verified_digests` leaves)
each ROUNDS times, in a new random order each round; prints the minimum and the median CPU seconds per
GiB (the minimum is the run the other load disturbed least).

usage (root, CRIU from `make setup`): .venv/bin/python bench/fill_cpu.py [--gib 2] [--rounds 3] [--workers N]
    [--modes criu,fast,fast-4k,verified]    or    --primitives [--gib 0.5] [--rounds 7] [--workers 1] [--only ...]
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import mmap
import os
import random
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))

from podsnap.engine import CaptureOptions, RestoreOptions, capture, kill_tree, restore, wait_gone  # noqa: E402
from podsnap.engine._procmem import ProcessMemory, map_readonly, unmap  # noqa: E402

GIB = float(1 << 30)


def worker(gib: float, ready: Path) -> None:
    """The process captured: the region, its digest written to `ready`, then asleep until killed."""
    size = int(gib * GIB)
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    seed = os.urandom(16)
    for off in range(0, size, 1 << 20):
        # every MiB different and no page zero, cheaper than os.urandom for GiBs
        region[off : off + (1 << 20)] = hashlib.sha256(seed + off.to_bytes(8, "little")).digest() * (1 << 15)
    ready.write_text(hashlib.sha256(region).hexdigest())
    while True:
        time.sleep(3600)


def region_digest(pid: int) -> str:
    """sha256 of the worker's region, read from outside through /proc (the biggest anonymous mapping)."""
    best = (0, 0)
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split()
        if len(parts) == 5:  # anonymous: no path
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            best = max(best, (hi - lo, lo))
    h = hashlib.sha256()
    with Path(f"/proc/{pid}/mem").open("rb", buffering=0) as mem:
        mem.seek(best[1])
        left = best[0]
        while left:
            chunk = mem.read(min(left, 8 << 20))
            h.update(chunk)
            left -= len(chunk)
    return h.hexdigest()


def start(gib: float, work: Path) -> tuple[int, str]:
    ready, pidfile = work / "ready", work / "pid"
    ready.unlink(missing_ok=True)
    cmd = f"echo $$ > {pidfile}; exec {sys.executable} {__file__} --worker {gib} {ready} </dev/null >/dev/null 2>&1"
    subprocess.run(["setsid", "-f", "sh", "-c", cmd], check=True)
    deadline = time.monotonic() + 600
    while not (ready.exists() and ready.read_text()):
        if time.monotonic() > deadline:
            raise TimeoutError("worker did not start")
        time.sleep(0.05)
    return int(pidfile.read_text()), ready.read_text()


MODES: dict[str, tuple[CaptureOptions, bool]] = {
    "criu": (CaptureOptions(fast_restore=False), False),
    "fast": (CaptureOptions(), False),
    "fast-4k": (CaptureOptions(bulk_hugepages=False), False),
    "fast-4k-sha256": (CaptureOptions(bulk_hugepages=False, digest="sha256"), False),
    "verified": (CaptureOptions(), True),
    "verified-4k": (CaptureOptions(bulk_hugepages=False), True),
}


def one(gib: float, mode: str, workers: int | None, scratch: Path) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(dir=scratch))
    pid = 0
    opts, verified = MODES[mode]
    try:
        pid, digest = start(gib, work)
        cap = capture(pid, work / "art", opts)
        cpu0 = _cpu_s()
        res = restore(
            work / "art",
            RestoreOptions(
                expected_manifest_digest=cap.manifest_digest, fill_workers=workers, verified_digests=verified
            ),
        )
        # + the restored task's own CPU: CRIU's restorer copies the pages inside it, and it is not our child
        cpu = _cpu_s() - cpu0 + _task_cpu_s(res.pid)
        ok = region_digest(res.pid) == digest
        return {
            "capture_ms": cap.timings_ms,
            "restore_ms": res.timings_ms,
            "capture_bytes": cap.phase_bytes,
            "restore_bytes": res.phase_bytes,
            "schema": cap.manifest.schema_version,
            "restore_cpu_s": cpu,
            "bit_exact": ok,
        }
    finally:
        if pid:
            kill_tree([pid])
            wait_gone(pid, timeout_s=30)
        shutil.rmtree(work, ignore_errors=True)


def _cpu_s() -> float:
    """User + system CPU seconds of this process and its waited-for children (CRIU)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _task_cpu_s(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def median_phases(runs: list[dict[str, Any]], key: str) -> dict[str, float]:
    names = sorted({n for r in runs for n in r[key]})
    return {n: statistics.median(r[key].get(n, 0.0) for r in runs) for n in names}


def engine_modes(a: argparse.Namespace) -> dict[str, Any]:
    modes = [m for m in a.modes.split(",") if m]
    if bad := [m for m in modes if m not in MODES]:
        raise SystemExit(f"--modes: unknown {bad}; use {', '.join(MODES)}")
    doc: dict[str, Any] = {"gib": a.gib, "cpus": os.cpu_count(), "workers": a.workers, "modes": {}}
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for _ in range(a.rounds):
        for mode in modes:
            runs[mode].append(one(a.gib, mode, a.workers, a.scratch))
    for mode in modes:
        restore_ms = median_phases(runs[mode], "restore_ms")
        doc["modes"][mode] = {
            "runs": runs[mode],
            "capture_ms": median_phases(runs[mode], "capture_ms"),
            "restore_ms": restore_ms,
            "bit_exact": all(r["bit_exact"] for r in runs[mode]),
        }
        fill = runs[mode][0]["restore_bytes"].get("fill", 0)
        rate = f", fill {fill / GIB / (restore_ms['fill'] / 1000):.2f} GiB/s" if fill and restore_ms.get("fill") else ""
        shown = {k: round(v) for k, v in restore_ms.items() if v >= 1}
        cpu = statistics.median(r["restore_cpu_s"] for r in runs[mode])
        doc["modes"][mode]["restore_cpu_s"] = cpu
        print(f"{mode:8s} restore {restore_ms['total'] / 1000:.2f}s {shown}{rate}; CPU {cpu:.2f}s", flush=True)
        print(f"         capture {doc['modes'][mode]['capture_ms']['total'] / 1000:.2f}s", flush=True)
    return doc


# --- --primitives: the ways to write into a stopped process, side by side ---------------------------------

PRIMITIVES = (
    "mmap-mem",
    "mmap-pvw",
    "buf-pvw",
    "copy-pvw",
    "mmap-mem-nohash",
    "mmap-pvw-nohash",
    "buf-pvw-nohash",
)
MIB = 1 << 20


def _stopped_child(size: int, huge: bool) -> tuple[int, int]:
    """A child with `size` bytes of fresh anonymous memory (2 MiB-aligned), stopped: (pid, address)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        m = mmap.mmap(-1, size + 2 * MIB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        base = (addr + 2 * MIB - 1) // (2 * MIB) * (2 * MIB)
        m.madvise(mmap.MADV_HUGEPAGE if huge else mmap.MADV_NOHUGEPAGE, base - addr, size)
        os.write(w, base.to_bytes(8, "little"))
        os.kill(os.getpid(), signal.SIGSTOP)
        os._exit(0)
    base = int.from_bytes(os.read(r, 8), "little")
    os.close(r)
    os.close(w)
    return pid, base


def _primitive(variant: str, src: Path, size: int, huge: bool, *, workers: int, block_bytes: int) -> dict[str, float]:
    pid, base = _stopped_child(size, huge)
    fd = os.open(src, os.O_RDONLY)
    mapped = map_readonly(fd, size)
    source = memoryview((ctypes.c_char * size).from_address(mapped)).cast("B")
    target = ProcessMemory(pid, method="mem" if "-mem" in variant else "auto")
    hashing = not variant.endswith("-nohash")
    local = threading.local()

    def chunk(start: int) -> None:
        end = min(size, start + 64 * MIB)
        h = hashlib.sha256()
        for block in range(start, end, block_bytes):
            n = min(block_bytes, end - block)
            if variant.startswith(("buf", "copy")):
                if not hasattr(local, "buf"):
                    local.buf = (ctypes.c_char * block_bytes)()
                    local.view = memoryview(local.buf).cast("B")
                if variant.startswith("buf"):
                    os.preadv(fd, [local.view[:n]], block)
                else:
                    local.view[:n] = source[block : block + n]
                if hashing:
                    h.update(local.view[:n])
                target.write(base + block, ctypes.addressof(local.buf), n)
            else:
                if hashing:
                    h.update(source[block : block + n])
                target.write(base + block, mapped + block, n)

    try:
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(chunk, range(0, size, 64 * MIB)))
        wall = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        with Path(f"/proc/{pid}/mem").open("rb", buffering=0) as mem:
            mem.seek(base + size - MIB)
            ok = mem.read(MIB) == bytes(source[size - MIB : size])
        huge_bytes = sum(
            int(line.split()[1]) << 10
            for line in Path(f"/proc/{pid}/smaps").read_text().splitlines()
            if line.startswith("AnonHugePages:")
        )
    finally:
        target.close()
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        source.release()
        unmap(mapped, size)
        os.close(fd)
    if not ok:
        raise SystemExit(f"{variant}: the bytes written differ from the source")
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "sys_s": r1.ru_stime - r0.ru_stime, "huge_bytes": huge_bytes}


def primitives(a: argparse.Namespace) -> dict[str, Any]:
    size = int(a.gib * GIB) // MIB * MIB
    src = a.scratch / "fill-cpu-source.bin"
    seed = os.urandom(16)
    with src.open("wb") as f:
        for off in range(0, size, MIB):
            f.write(hashlib.sha256(seed + off.to_bytes(8, "little")).digest() * (MIB // 32))
    workers = a.workers or 1
    doc: dict[str, Any] = {
        "gib": size / GIB,
        "cpus": os.cpu_count(),
        "workers": workers,
        "block_kib": a.block_kib,
        "primitives": {},
    }
    runs: dict[str, list[dict[str, float]]] = {}
    try:
        combos = [(v, huge) for v in a.only.split(",") for huge in (False, True)]
        for _ in range(a.rounds):
            # a new order each round: the memory a run leaves free shapes the next (4 KiB vs 2 MiB blocks)
            random.shuffle(combos)
            for variant, huge in combos:
                runs.setdefault(f"{variant} {'thp' if huge else '4k'}", []).append(
                    _primitive(variant, src, size, huge, workers=workers, block_bytes=a.block_kib << 10)
                )
    finally:
        src.unlink(missing_ok=True)
    print(
        f"CPU seconds per GiB written ({size / GIB:g} GiB, {workers} thread(s), {a.block_kib} KiB blocks, "
        f"{a.rounds} rounds):"
    )
    for name, rs in sorted(runs.items()):
        per = sorted(r["cpu_s"] * GIB / size for r in rs)
        doc["primitives"][name] = {"runs": rs, "min_cpu_s_per_gib": per[0], "median_cpu_s_per_gib": per[len(per) // 2]}
        print(f"  {name:22s} min {per[0]:.2f}  median {per[len(per) // 2]:.2f}", flush=True)
    return doc


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(float(sys.argv[2]), Path(sys.argv[3]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--gib", type=float, default=2.0, help="size of the worker's random region")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=None, help="fill threads (default: the engine's, min(16, cpus))")
    ap.add_argument("--scratch", type=Path, default=Path("/dev/shm"), help="where artifacts go (tmpfs: page cache)")
    ap.add_argument("--modes", default="criu,fast", help=f"engine modes: {', '.join(MODES)}")
    ap.add_argument("--primitives", action="store_true", help="compare the write primitives instead (no CRIU)")
    ap.add_argument("--only", default=",".join(PRIMITIVES), help="--primitives: these variants only")
    ap.add_argument("--block-kib", type=int, default=1024, help="--primitives: bytes read, hashed and written at once")
    a = ap.parse_args()
    doc = primitives(a) if a.primitives else engine_modes(a)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "fill-cpu.json").write_text(json.dumps(doc, indent=1))
    return 0 if all(m["bit_exact"] for m in doc.get("modes", {}).values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
