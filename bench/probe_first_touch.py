"""Probe: is a fresh machine's first restore slow because its memory is written for the first time? (one GPU call)

On the H200 machine the first round trip after the machine starts restored in 5.13 s (fill 2.70 s, CUDA
restore 2.05 s) and every later one in 2.79-2.95 s (bench/NOTES.md, 03:15 UTC). Both slow phases write
fresh host memory. Hypothesis: the machine is a VM whose RAM the hypervisor backs only when the guest first
writes it, so the first pass over any guest page costs a hypervisor fault, and nothing podsnap does.

So, on a freshly started machine, before anything else: write `--touch-gib` of fresh anonymous memory
(MADV_HUGEPAGE, as the fill advises its mappings) with one thread per CPU in a child process, twice (A, B:
the second child mostly gets the pages the first freed); then `--prime-gib` once; then `--touch-gib` again
(C: every page it gets has been written before). Then the 8 GiB eager round trip in namespace mode twice.
If A is much slower than B and C, and the first round trip after the priming is as fast as the second, the
first-restore cost is the machine's, not podsnap's.

usage: PODSNAP_CRIU=... python3 bench/probe_first_touch.py [--touch-gib 16] [--prime-gib 96] [--weights-gib 8]
JSON: $OUT/first-touch.json (else bench/results/first-touch.json)
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))

GIB = 1 << 30


def touch(gib: float) -> dict[str, float]:
    """Write `gib` of fresh anonymous memory with one thread per CPU; the time and the rate."""
    size = int(gib * GIB)
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.madvise(mmap.MADV_HUGEPAGE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    step = 256 << 20
    slices = iter(range(0, size, step))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                start = next(slices, None)
            if start is None:
                return
            ctypes.memset(base + start, 1, min(step, size - start))  # a foreign call: the GIL is released

    threads = [threading.Thread(target=work) for _ in range(os.cpu_count() or 1)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    return {"gib": gib, "s": elapsed, "GiBps": gib / elapsed, "threads": len(threads)}


def touch_in_child(gib: float) -> dict[str, float]:
    """`touch` in a process of its own, so its memory is freed when it ends."""
    proc = subprocess.run(
        [sys.executable, __file__, "--child-touch", str(gib)], check=True, capture_output=True, text=True
    )
    return dict(json.loads(proc.stdout))


def meminfo() -> dict[str, int]:
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in {"MemTotal", "MemFree", "MemAvailable", "Cached", "AnonHugePages"}:
            out[key] = int(rest.split()[0]) << 10
    return out


def round_trips(weights_gib: str, count: int) -> list[dict[str, Any]]:
    from podsnap.demo import _roundtrip as rt
    from podsnap.demo import free_port

    scratch = Path("/dev/shm/podsnap-first-touch")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    weights = scratch / "weights.bin"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "python"), os.environ.get("PYTHONPATH", "")])}
    demo = [sys.executable, "-m", "podsnap.demo", "--device", "cuda"]
    subprocess.run(
        [*demo, "--write-weights", str(weights), "--weights-gib", weights_gib, "--dtype", "float16"],
        check=True,
        env=env,
    )
    args = ["--device", "cuda", "--weights-gib", weights_gib, "--dtype", "float16", "--weights-file", str(weights)]
    rows = []
    for i in range(count):
        try:
            r = rt.round_trip(scratch / f"case-{i}", args, port=free_port(), env=env, namespaces=True)
        finally:
            shutil.rmtree(scratch / f"case-{i}", ignore_errors=True)
        t = r["restore"]["timings_ms"]
        row = {
            "round_trip": i + 1,
            "restore_s": r["restore_s"],
            "fill_ms": t.get("fill"),
            "fill_bytes": r["restore"].get("phase_bytes", {}).get("fill"),
            "cuda_restore_ms": t.get("cuda_restore"),
            "criu_restore_ms": t.get("criu_restore"),
            "cold_start_s": r["cold_start_s"],
            "bit_exact": r["bit_exact"],
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    shutil.rmtree(scratch, ignore_errors=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--touch-gib", type=float, default=16)
    ap.add_argument("--prime-gib", type=float, default=96)
    ap.add_argument("--weights-gib", default="8")
    ap.add_argument("--round-trips", type=int, default=2)
    ap.add_argument("--child-touch", type=float, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child_touch is not None:
        print(json.dumps(touch(a.child_touch)))
        return 0
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else REPO / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    uptime_s = float(Path("/proc/uptime").read_text().split()[0])
    result: dict[str, Any] = {"uptime_at_start_s": uptime_s, "meminfo_at_start": meminfo(), "touch": {}}
    for label, gib in (("A", a.touch_gib), ("B", a.touch_gib), ("prime", a.prime_gib), ("C", a.touch_gib)):
        result["touch"][label] = touch_in_child(gib)
        print(label, json.dumps(result["touch"][label]), flush=True)
    result["meminfo_after_touch"] = meminfo()
    (out / "first-touch.json").write_text(json.dumps(result, indent=1))
    if a.round_trips:
        result["round_trips"] = round_trips(a.weights_gib, a.round_trips)
        (out / "first-touch.json").write_text(json.dumps(result, indent=1))
    return 0 if all(r["bit_exact"] for r in result.get("round_trips", [])) else 1


if __name__ == "__main__":
    raise SystemExit(main())
