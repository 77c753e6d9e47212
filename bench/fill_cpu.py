"""The transparent fast restore against CRIU's own page restore, on any Linux host (no GPU), real CRIU.

A worker holds SIZE GiB of random bytes in one anonymous mapping (what a CUDA checkpoint leaves in a
worker's host memory). For each mode, ROUNDS times: capture it (`fast_restore` off: CRIU keeps every
page, schema 1; on: the region goes to a raw bulk file, schema 2), restore it, check the region's
sha256. Prints the median of each phase and the CPU seconds the restore used (ours, CRIU's, and the restored
task's, inside which CRIU's restorer copies the pages: on a busy machine wall times follow the load,
CPU seconds do not); writes JSON to $OUT/fill-cpu.json when OUT
is set.

usage (root, CRIU from `make setup`): .venv/bin/python bench/fill_cpu.py [--gib 2] [--rounds 3] [--workers N]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import mmap
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))

from podsnap.engine import CaptureOptions, RestoreOptions, capture, kill_tree, restore, wait_gone  # noqa: E402

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


def one(gib: float, fast: bool, workers: int | None, scratch: Path) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(dir=scratch))
    pid = 0
    try:
        pid, digest = start(gib, work)
        cap = capture(pid, work / "art", CaptureOptions(fast_restore=fast))
        cpu0 = _cpu_s()
        res = restore(work / "art", RestoreOptions(expected_manifest_digest=cap.manifest_digest, fill_workers=workers))
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


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(float(sys.argv[2]), Path(sys.argv[3]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--gib", type=float, default=2.0, help="size of the worker's random region")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=None, help="fill threads (default: the engine's, min(16, cpus))")
    ap.add_argument("--scratch", type=Path, default=Path("/dev/shm"), help="where artifacts go (tmpfs: page cache)")
    a = ap.parse_args()
    doc: dict[str, Any] = {"gib": a.gib, "cpus": os.cpu_count(), "workers": a.workers, "modes": {}}
    for mode, fast in (("criu", False), ("fast", True)):
        runs = [one(a.gib, fast, a.workers, a.scratch) for _ in range(a.rounds)]
        restore_ms = median_phases(runs, "restore_ms")
        doc["modes"][mode] = {
            "runs": runs,
            "capture_ms": median_phases(runs, "capture_ms"),
            "restore_ms": restore_ms,
            "bit_exact": all(r["bit_exact"] for r in runs),
        }
        fill = runs[0]["restore_bytes"].get("fill", 0)
        rate = f", fill {fill / GIB / (restore_ms['fill'] / 1000):.2f} GiB/s" if fill and restore_ms.get("fill") else ""
        shown = {k: round(v) for k, v in restore_ms.items() if v >= 1}
        cpu = statistics.median(r["restore_cpu_s"] for r in runs)
        doc["modes"][mode]["restore_cpu_s"] = cpu
        print(f"{mode:5s} restore {restore_ms['total'] / 1000:.2f}s {shown}{rate}; CPU {cpu:.2f}s", flush=True)
        print(f"      capture {doc['modes'][mode]['capture_ms']['total'] / 1000:.2f}s", flush=True)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "fill-cpu.json").write_text(json.dumps(doc, indent=1))
    return 0 if all(m["bit_exact"] for m in doc["modes"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
