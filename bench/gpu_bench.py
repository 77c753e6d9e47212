"""Cold start vs restore of the demo worker on the GPU, at several weight sizes, with and without compile.

One run measures, in this order: the machine's facts, pinned host->device copy speed (torch), then
for each size (default 1, 8, 32 GiB) and each variant (eager, compile) one round trip of
`podsnap.demo._roundtrip`: cold start from a weights file in page cache (tmpfs) -> capture ->
restore -> first answer, bit-exactness checked. The JSON is rewritten after every case, so a run cut
short still returns what it measured. The side-by-side table is printed last.

usage: bench/run-gpu.sh [--sizes 1,8,32] [--variants eager,compile]   (JSON: $OUT/bench.json, else bench/results/)
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))

from podsnap.demo._roundtrip import round_trip  # noqa: E402

GIB = float(1 << 30)
#: the naive sequence measured before podsnap: 8 GiB of weights restored in 9 s
NAIVE_8GIB_RESTORE_S = 9.0
NAIVE_EFFECTIVE_GIBPS = 1.2


def sh(cmd: str) -> str:
    p = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=60, check=False)
    return (p.stdout + p.stderr).strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def machine_facts() -> dict[str, Any]:
    return {
        "kernel": platform.release(),
        "python": platform.python_version(),
        "gpu": sh("nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader"),
        "cpus": os.cpu_count(),
        "mem_total": sh("grep MemTotal /proc/meminfo"),
        "thp": sh("cat /sys/kernel/mm/transparent_hugepage/enabled"),
        "packages": sh(f"{sys.executable} -m pip list 2>/dev/null | grep -Ei '^(torch|cuda-bindings|nvidia-ml-py) '"),
        "criu": os.environ.get("PODSNAP_CRIU", ""),
    }


def pinned_h2d_gbps(gib: int = 4, reps: int = 5) -> float:
    import torch

    n = gib << 30
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    host.random_(0, 255)
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        dev.copy_(host, non_blocking=True)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    del host, dev
    torch.cuda.empty_cache()
    times.sort()
    return n / times[len(times) // 2] / 1e9


def rate(nbytes: int | None, ms: float | None) -> float | None:
    if not nbytes or not ms:
        return None
    return nbytes / GIB / (ms / 1000)


def summarize(size: float, variant: str, r: dict[str, Any]) -> dict[str, Any]:
    cap, res = r["capture"], r["restore"]
    ct, rt = cap["timings_ms"], res["timings_ms"]
    gpu = r.get("gpu_bytes") or int(size * GIB)
    mem = cap["bytes_memory"]
    phases = {
        "cuda_checkpoint": {"s": ct.get("cuda_checkpoint", 0) / 1000, "GiBps": rate(gpu, ct.get("cuda_checkpoint"))},
        "criu_dump": {"s": ct.get("criu_dump", 0) / 1000, "GiBps": rate(mem, ct.get("criu_dump"))},
        "hash": {"s": ct.get("hash", 0) / 1000, "GiBps": rate(cap["bytes_total"], ct.get("hash"))},
        "verify": {"s": rt.get("verify", 0) / 1000, "GiBps": rate(res["bytes_total"], rt.get("verify"))},
        "criu_restore": {"s": rt.get("criu_restore", 0) / 1000, "GiBps": rate(mem, rt.get("criu_restore"))},
        "cuda_restore": {"s": rt.get("cuda_restore", 0) / 1000, "GiBps": rate(gpu, rt.get("cuda_restore"))},
        "resume": {"s": res["resume_s"], "GiBps": None},
    }
    return {
        "weights_gib": size,
        "variant": variant,
        "gpu_bytes": gpu,
        "artifact_bytes": cap["bytes_total"],
        "memory_bytes": mem,
        "cold_start_s": r["cold_start_s"],
        "worker_phases_s": r["before"]["health"]["phases_s"],
        "capture_s": r["capture_s"],
        "restore_s": r["restore_s"],
        "restore_over_cold": r["restore_over_cold"],
        "restore_effective_GiBps": size / r["restore_s"],
        "restore_without_hashing_s": r["restore_s"] - phases["verify"]["s"],
        "h2d_floor_s": None,
        "phases": phases,
        "bit_exact": r["bit_exact"],
        "same_worker": r["same_worker"],
    }


def table(doc: dict[str, Any]) -> str:
    h2d = doc.get("pinned_h2d_GBps")
    head = (
        "weights  variant  cold s  capture s  restore s  rest/cold  eff GiB/s  "
        "ckpt GiB/s  dump GiB/s  hash s  verify s  crestore GiB/s  cudarest GiB/s  floor s  exact"
    )
    lines = [head, "-" * len(head)]
    for c in doc["cases"]:
        if "error" in c:
            lines.append(f"{c['weights_gib']:>5g}G  {c['variant']:<7}  ERROR {c['error'][:100]}")
            continue
        p = c["phases"]

        def g(name: str, p: dict[str, Any] = p) -> str:
            v = p[name]["GiBps"]
            return f"{v:.2f}" if v else "-"

        lines.append(
            f"{c['weights_gib']:>5g}G  {c['variant']:<7}  {c['cold_start_s']:6.2f}  {c['capture_s']:9.2f}  "
            f"{c['restore_s']:9.2f}  {c['restore_over_cold']:9.2f}  {c['restore_effective_GiBps']:9.2f}  "
            f"{g('cuda_checkpoint'):>10}  {g('criu_dump'):>10}  {p['hash']['s']:6.2f}  {p['verify']['s']:8.2f}  "
            f"{g('criu_restore'):>14}  {g('cuda_restore'):>14}  "
            f"{(c['h2d_floor_s'] or 0):7.2f}  {'yes' if c['bit_exact'] and c['same_worker'] else 'NO'}"
        )
    lines.append("")
    lines.append(
        f"reference: naive restore of 8 GiB = {NAIVE_8GIB_RESTORE_S:.0f} s ({NAIVE_EFFECTIVE_GIBPS} GiB/s effective); "
        f"pinned host->device here = {h2d:.1f} GB/s (floor s = weights / that rate)"
        if h2d
        else "reference: naive restore of 8 GiB = 9 s (1.2 GiB/s effective)"
    )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--sizes", default="1,8,32", help="weight sizes in GiB, comma-separated")
    ap.add_argument("--variants", default="eager,compile", help="eager and/or compile")
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    ap.add_argument("--scratch", type=Path, default=Path("/dev/shm/podsnap-bench"), help="weights file + artifacts")
    ap.add_argument("--out", type=Path, default=None, help="JSON file (default $OUT/bench.json or bench/results/)")
    ap.add_argument(
        "--thp",
        choices=("keep", "always", "madvise", "never"),
        default="keep",
        help="set transparent huge pages for the run (this machine's kernel; restored afterwards)",
    )
    ap.add_argument("--budget-s", type=float, default=420.0, help="skip cases that would start after this many s")
    ap.add_argument(
        "--drop-file-from-gib",
        type=float,
        default=16.0,
        help="free the tmpfs weights file before capture from this size",
    )
    a = ap.parse_args()
    t_start = time.monotonic()
    sizes = [float(s) for s in a.sizes.split(",") if s]
    variants = [v for v in a.variants.split(",") if v]
    bad = [v for v in variants if v not in {"eager", "compile"}]
    if bad:
        ap.error(f"--variants: unknown {bad}; use eager and/or compile")
    if a.out is not None:
        out = a.out
    elif os.environ.get("OUT"):
        out = Path(os.environ["OUT"]) / "bench.json"
    else:
        out = REPO / "bench" / "results" / f"gpu-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine_facts(),
        "command": " ".join(sys.argv),
        "reference": {"naive_8gib_restore_s": NAIVE_8GIB_RESTORE_S, "naive_effective_GiBps": NAIVE_EFFECTIVE_GIBPS},
        "cases": [],
    }

    thp_file = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    thp_before = None
    if a.thp != "keep":
        thp_before = thp_file.read_text().split("[")[1].split("]")[0]
        thp_file.write_text(a.thp)
        doc["machine"]["thp"] = thp_file.read_text().strip()
    print(json.dumps(doc["machine"], indent=1), flush=True)
    try:
        return run_cases(a, doc, out, sizes=sizes, variants=variants, t_start=t_start)
    finally:
        if thp_before is not None:
            thp_file.write_text(thp_before)


def run_cases(
    a: argparse.Namespace, doc: dict[str, Any], out: Path, *, sizes: list[float], variants: list[str], t_start: float
) -> int:
    def save() -> None:
        out.write_text(json.dumps(doc, indent=1))

    doc["pinned_h2d_GBps"] = pinned_h2d_gbps()
    print(f"pinned host->device: {doc['pinned_h2d_GBps']:.1f} GB/s", flush=True)
    save()

    shutil.rmtree(a.scratch, ignore_errors=True)
    a.scratch.mkdir(parents=True)
    weights = a.scratch / "weights.bin"
    doc["weights_file_writes"] = []

    def ensure_weights(size: float) -> None:
        """One file serves every size (a worker reads its prefix); rewritten when a big case dropped it."""
        need = int(size * GIB)
        if weights.exists() and weights.stat().st_size >= need:
            return
        t = time.monotonic()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "podsnap.demo",
                "--device",
                "cuda",
                "--write-weights",
                str(weights),
                "--weights-gib",
                str(max(sizes)),
                "--dtype",
                a.dtype,
            ],
            check=True,
            env={**os.environ, "PYTHONPATH": str(REPO / "python")},
        )
        took = time.monotonic() - t
        doc["weights_file_writes"].append({"bytes": weights.stat().st_size, "s": took})
        print(f"weights file {weights.stat().st_size / GIB:.1f} GiB written to {weights} in {took:.1f}s", flush=True)

    def drop_weights() -> None:
        # tmpfs file + checkpointed process + CRIU images would each hold the weights: ~3x RAM at 32 GiB
        weights.unlink(missing_ok=True)

    env = {**os.environ, "PYTHONPATH": str(REPO / "python")}
    for size in sizes:
        for variant in variants:
            elapsed = time.monotonic() - t_start
            if elapsed > a.budget_s:
                doc["cases"].append({"weights_gib": size, "variant": variant, "error": f"skipped: {elapsed:.0f}s used"})
                save()
                continue
            args = ["--device", "cuda", "--weights-gib", str(size), "--dtype", a.dtype, "--weights-file", str(weights)]
            if variant == "compile":
                args.append("--compile")
            work = a.scratch / f"{size:g}-{variant}"
            print(f"== {size:g} GiB {variant}", flush=True)
            try:
                ensure_weights(size)
                r = round_trip(
                    work,
                    args,
                    port=free_port(),
                    env=env,
                    progress=lambda m: print(f"   {m}", flush=True),
                    after_cold_start=drop_weights if size >= a.drop_file_from_gib else None,
                )
                case = summarize(size, variant, r)
                if doc.get("pinned_h2d_GBps"):
                    case["h2d_floor_s"] = size * GIB / (doc["pinned_h2d_GBps"] * 1e9)
                case["raw"] = r
            except Exception as e:
                traceback.print_exc()
                case = {"weights_gib": size, "variant": variant, "error": f"{type(e).__name__}: {e}"[:4000]}
                # only failures bring their worker's log back: few files may come back from the device
                with contextlib.suppress(OSError):
                    shutil.copy(work / "worker.log", out.parent / f"worker-{size:g}-{variant}.log")
            finally:
                shutil.rmtree(work, ignore_errors=True)
            doc["cases"].append(case)
            save()
    shutil.rmtree(a.scratch, ignore_errors=True)
    doc["elapsed_s"] = time.monotonic() - t_start
    save()
    print(f"\nJSON: {out}\n")
    print(table(doc), flush=True)
    return 0 if all("error" not in c and c["bit_exact"] for c in doc["cases"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
