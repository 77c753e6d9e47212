"""Cold start vs restore of the demo worker on the GPU: 8 and 32 GiB, eager and compiled, both restore paths.

One run (`make bench-gpu` = bench/run-gpu.sh) measures, in this order:
  1. the machine's facts and the floor: pinned host->device copy speed (torch), measured in this run;
  2. for each size, each path and each variant, one round trip of `podsnap.demo.round_trip`: cold start
     (the worker reads its weights from a tmpfs file: page cache) -> capture -> restore -> first answer,
     bit-exactness checked (same weights checksum, tokens, answer, init id, pid).
Paths: `transparent` (any worker; the engine's fast restore: bulk memory written back in parallel, its
mappings advised MADV_HUGEPAGE), `cooperative` (the worker hands its weights to the SDK: released before
the checkpoint, streamed back at resume; runs first at each size since it reloads from the weights file)
`transparent-4k` (transparent without the huge-page advice, for the A/B) and `transparent-sha256` /
`cooperative-sha256` (the artifact digested with SHA-256, as before BLAKE3, for that A/B; the digest
algorithm of each case is in its JSON). Every engine phase is timed
with the bytes it handled (the engine's progress reports), so each one prints with its rate. Each case
then restores its artifact a second time with `verified_digests` (as from the agent's node-local cache,
verified when filled: nothing hashed again) and reports that restore beside the first (`cached`;
`--no-cached-restore` skips it). The JSON is rewritten after every case, so a run cut short still
returns what it measured; the side-by-side table and issue 9's targets are printed last.

usage: bench/run-gpu.sh [--sizes 8,32] [--variants eager,compile] [--paths transparent,cooperative,transparent-4k]
       (JSON: $OUT/bench.json when OUT is set, else bench/results/gpu-<time>.json)
CPU dry run of the whole pipeline (no GPU, no torch; numpy weights generated in the worker):
       python bench/gpu_bench.py --device cpu --sizes 0.25 --variants eager
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))

from podsnap.demo import free_port, round_trip  # noqa: E402
from podsnap.engine import Progress  # noqa: E402

GIB = float(1 << 30)
#: the naive sequence measured before podsnap: 8 GiB of weights restored in 9 s
NAIVE_8GIB_RESTORE_S = 9.0
NAIVE_EFFECTIVE_GIBPS = 1.2
#: the demo worker's arguments per restore path (the hook for another path: one more entry)
PATHS: dict[str, list[str]] = {
    "transparent": [],
    "cooperative": ["--cooperative"],
    "transparent-4k": [],
    # the artifact digested with SHA-256 (every artifact before BLAKE3), for the A/B in one run
    "transparent-sha256": [],
    "cooperative-sha256": ["--cooperative"],
}
#: round_trip keywords per path (capture options)
PATH_OPTIONS: dict[str, dict[str, Any]] = {
    "transparent-4k": {"bulk_hugepages": False},
    "transparent-sha256": {"digest": "sha256"},
    "cooperative-sha256": {"digest": "sha256"},
}
#: issue 9's "done when", per path: 8 GiB eager restore -> first answer (s), effective GiB/s (8 and 32 GiB),
#: restore / cold start for eager and for compiled
TARGETS: dict[str, dict[str, float]] = {
    "transparent": {"eager_8gib_s": 3.0, "effective_GiBps": 3.0, "eager_ratio": 0.5, "compile_ratio": 0.25},
    "cooperative": {"eager_8gib_s": 1.5, "effective_GiBps": 10.0, "eager_ratio": 0.25, "compile_ratio": 0.12},
}
for _path in PATHS:
    TARGETS.setdefault(_path, TARGETS[_path.split("-")[0]])
CAPTURE_PHASES = ("cuda_lock", "cuda_checkpoint", "criu_dump", "cut", "hash", "reap", "publish")
RESTORE_PHASES = ("verify", "compat", "criu_restore", "fill", "resume", "cuda_restore", "cuda_unlock")


def sh(cmd: str) -> str:
    p = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=60, check=False)
    return (p.stdout + p.stderr).strip()


def machine_facts() -> dict[str, Any]:
    return {
        "kernel": platform.release(),
        "python": platform.python_version(),
        "gpu": sh("nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader"),
        "cpus": os.cpu_count(),
        "cpu": sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"),
        # sha_ni: the fill's and verify's sha256 runs on these instructions where they exist
        "cpu_flags": sh("grep -m1 -o -w -E 'sha_ni|avx512f|avx2' /proc/cpuinfo | sort -u | tr '\\n' ' '"),
        "thp_defrag": sh("cat /sys/kernel/mm/transparent_hugepage/defrag"),
        "mem_total": sh("grep MemTotal /proc/meminfo"),
        "thp": sh("cat /sys/kernel/mm/transparent_hugepage/enabled"),
        "packages": sh(
            f"{sys.executable} -m pip list 2>/dev/null | grep -Ei '^(torch|cuda-bindings|nvidia-ml-py|blake3) '"
        ),
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


class PhaseLog:
    """The engine's `progress=` callback: each phase's last report (seconds, bytes done, of total)."""

    def __init__(self) -> None:
        self.phases: dict[str, dict[str, float]] = {}

    def __call__(self, p: Progress) -> None:
        if p.finished:
            self.phases[p.phase] = {"s": p.elapsed_ms / 1000, "bytes": p.done, "of": p.total}


def gibps(nbytes: float | None, seconds: float | None) -> float | None:
    return nbytes / GIB / seconds if nbytes and seconds else None


def phase_table(log: dict[str, dict[str, float]], names: tuple[str, ...], gpu: int) -> dict[str, dict[str, Any]]:
    """name -> s, bytes, GiB/s; the CUDA phases' rate is over the GPU memory they moved."""
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        if name not in log:
            continue
        entry = log[name]
        nbytes = gpu if name in ("cuda_checkpoint", "cuda_restore") else entry["bytes"]
        out[name] = {"s": entry["s"], "bytes": int(nbytes), "GiBps": gibps(nbytes, entry["s"])}
        if name == "cut":
            out[name]["large_runs_bytes"] = int(entry["of"])
    return out


def phases_of(timings_ms: dict[str, float], phase_bytes: dict[str, int], gpu: int) -> dict[str, dict[str, Any]]:
    """The phase table from a RestoreResult's timings and bytes (a restore that ran without progress)."""
    log = {n: {"s": ms / 1000, "bytes": phase_bytes.get(n, 0), "of": 0} for n, ms in timings_ms.items()}
    return phase_table(log, RESTORE_PHASES, gpu)


def summarize_cached(r: dict[str, Any], gpu: int, cold_s: float) -> dict[str, Any]:
    c = r["cached"]
    return {
        "restore_s": c["restore_s"],
        "restore_over_cold": c["restore_s"] / cold_s,
        "effective_GiBps": gpu / GIB / c["restore_s"],
        "restore_phases": phases_of(c["restore"]["timings_ms"], c["restore"].get("phase_bytes", {}), gpu),
        "resume_to_answer_s": c["restore"]["resume_s"],
        "cooperative": c["after"]["health"].get("cooperative"),
        "bit_exact": c["bit_exact"],
        "same_worker": c["same_worker"],
    }


def summarize(size: float, variant: str, path: str, r: dict[str, Any], *, log: PhaseLog, h2d: float) -> dict[str, Any]:
    gpu = int(r.get("gpu_bytes") or size * GIB)
    restore_s = r["restore_s"]
    capture_bytes = r["capture"].get("phase_bytes", {})
    return {
        "weights_gib": size,
        "variant": variant,
        "path": path,
        "namespaces": r.get("namespaces", False),
        "digest": r["capture"].get("digest"),
        "gpu_bytes": gpu,
        "artifact_bytes": r["capture"]["bytes_total"],
        "memory_bytes": r["capture"]["bytes_memory"],
        "cold_start_s": r["cold_start_s"],
        "worker_phases_s": r["before"]["health"].get("phases_s"),
        "capture_s": r["capture_s"],
        "restore_s": restore_s,
        "restore_over_cold": r["restore_over_cold"],
        "effective_GiBps": gpu / GIB / restore_s,
        "floor_s": gpu / (h2d * 1e9) if h2d else None,
        "capture_phases": phase_table(log.phases, CAPTURE_PHASES, gpu),
        "restore_phases": phase_table(log.phases, RESTORE_PHASES, gpu),
        # the mappings the cut advised MADV_HUGEPAGE (0: none, e.g. transparent-4k)
        "hugepage_advised_bytes": capture_bytes.get("hugepages", 0),
        # GPU memory left at the last quiesce hook: what the CUDA checkpoint carries (device-wide use, torch's)
        "gpu_at_checkpoint": r["after"]["health"].get("at_checkpoint"),
        # restore-context + restore-complete, the worker's resume hooks (a cooperative reload), first answer
        "resume_to_answer_s": r["restore"]["resume_s"],
        "cooperative": r["after"]["health"].get("cooperative"),
        "bit_exact": r["bit_exact"],
        "same_worker": r["same_worker"],
        "cached": summarize_cached(r, gpu, r["cold_start_s"]) if "cached" in r else None,
    }


def verdicts(case: dict[str, Any], restore: dict[str, Any] | None = None) -> dict[str, bool]:
    """Issue 9's targets this case (or its `restore`: the cached one) can be held to."""
    t = TARGETS.get(case["path"])
    if not t:
        return {}
    run = restore or case
    out = {
        "effective_GiBps": run["effective_GiBps"] >= t["effective_GiBps"],
        "ratio": run["restore_over_cold"] <= t[f"{case['variant']}_ratio"],
    }
    if case["weights_gib"] == 8 and case["variant"] == "eager":
        out["eager_8gib_s"] = run["restore_s"] <= t["eager_8gib_s"]
    return out


def phase_line(title: str, phases: dict[str, dict[str, Any]]) -> str:
    parts = []
    for name, p in phases.items():
        rate = f" {p['GiBps']:.1f} GiB/s" if p.get("GiBps") and p["bytes"] > (64 << 20) else ""
        extra = f" of {p['large_runs_bytes'] / GIB:.2f}" if name == "cut" else ""
        size = f" {p['bytes'] / GIB:.2f}{extra} GiB" if name in ("cut", "fill", "criu_dump", "criu_restore") else ""
        parts.append(f"{name} {p['s']:.2f}s{size}{rate}")
    return f"    {title:<8} " + " | ".join(parts)


def case_lines(c: dict[str, Any]) -> list[str]:
    head = (
        f"  {c['weights_gib']:g} GiB {c['path']} {c['variant']}: cold {c['cold_start_s']:.2f}s, "
        f"capture {c['capture_s']:.2f}s, restore {c['restore_s']:.2f}s ({c['restore_over_cold']:.2f}x cold, "
        f"{c['effective_GiBps']:.2f} GiB/s effective, floor {c['floor_s'] or 0:.2f}s), "
        f"{'bit-exact' if c['bit_exact'] and c['same_worker'] else 'NOT BIT-EXACT'}"
    )
    lines = [
        head,
        phase_line("capture", c["capture_phases"])
        + f" | huge pages advised {c['hugepage_advised_bytes'] / GIB:.2f} GiB",
        phase_line("restore", c["restore_phases"]) + f" | resume->answer {c['resume_to_answer_s']:.2f}s",
    ]
    cached = c.get("cached")
    if cached:
        lines.append(
            f"    cached   restore {cached['restore_s']:.2f}s ({cached['restore_over_cold']:.2f}x cold, "
            f"{cached['effective_GiBps']:.2f} GiB/s effective), "
            f"{'bit-exact' if cached['bit_exact'] and cached['same_worker'] else 'NOT BIT-EXACT'}"
        )
        lines.append(
            phase_line("", cached["restore_phases"]) + f" | resume->answer {cached['resume_to_answer_s']:.2f}s"
        )
    if c.get("gpu_at_checkpoint"):
        g = c["gpu_at_checkpoint"]
        lines.append(
            f"    at checkpoint: GPU in use {g.get('device_used_bytes', 0) / GIB:.2f} GiB "
            f"(torch reserved {g.get('torch_reserved_bytes', 0) / GIB:.2f}, allocated "
            f"{g.get('torch_allocated_bytes', 0) / GIB:.2f})"
        )
    return lines


def table(doc: dict[str, Any]) -> str:
    h2d = doc.get("pinned_h2d_GBps")
    head = (
        "weights  path         variant  cold s  capture s  restore s  rest/cold  eff GiB/s  floor s  "
        "fill GiB/s  cuda-rest s  cached s  exact  targets (cached)"
    )
    lines = [head, "-" * len(head)]
    for c in doc["cases"]:
        if "error" in c:
            lines.append(f"{c['weights_gib']:>5g}G  {c['path']:<14}  {c['variant']:<7}  ERROR {c['error'][:90]}")
            continue
        fill = c["restore_phases"].get("fill", {}).get("GiBps")
        cuda = c["restore_phases"].get("cuda_restore", {}).get("s")
        met = c.get("targets", {})
        met_cached = c.get("targets_cached", {})
        cached = c.get("cached") or {}
        exact = c["bit_exact"] and c["same_worker"] and (not cached or (cached["bit_exact"] and cached["same_worker"]))
        lines.append(
            f"{c['weights_gib']:>5g}G  {c['path']:<14}  {c['variant']:<7}  {c['cold_start_s']:6.2f}  "
            f"{c['capture_s']:9.2f}  {c['restore_s']:9.2f}  {c['restore_over_cold']:9.2f}  "
            f"{c['effective_GiBps']:9.2f}  {c['floor_s'] or 0:7.2f}  {fill or 0:10.1f}  {cuda or 0:11.2f}  "
            f"{cached.get('restore_s', 0):8.2f}  {'yes' if exact else 'NO':>5}  "
            + (" ".join(f"{k}={'ok' if v else 'MISS'}" for k, v in met.items()) or "-")
            + (
                " (" + " ".join(f"{k}={'ok' if v else 'MISS'}" for k, v in met_cached.items()) + ")"
                if met_cached
                else ""
            )
        )
    lines.append("")
    lines.append(
        f"floor s = GPU bytes / pinned host->device {h2d:.1f} GB/s measured in this run; "
        if h2d
        else "floor: not measured; "
    )
    lines[-1] += (
        f"reference: naive 8 GiB restore {NAIVE_8GIB_RESTORE_S:.0f} s ({NAIVE_EFFECTIVE_GIBPS} GiB/s effective); "
        "targets: issue 9 (8 GiB eager restore, effective GiB/s, restore/cold)"
    )
    return "\n".join(lines)


def plan(sizes: list[float], paths: list[str], variants: list[str]) -> list[tuple[float, str, str]]:
    """Cooperative cases first at each size: they reload from the weights file, which the transparent ones
    free before their capture at large sizes (tmpfs file + checkpointed process + images exceed the RAM)."""
    order = sorted(paths, key=lambda p: not p.startswith("cooperative"))
    return [(size, path, variant) for size in sizes for path in order for variant in variants]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--sizes", default="8,32", help="weight sizes in GiB, comma-separated")
    ap.add_argument("--variants", default="eager,compile", help="eager and/or compile")
    ap.add_argument("--paths", default="transparent,cooperative", help=f"restore paths: {', '.join(PATHS)}")
    ap.add_argument("--namespaces", action="store_true", help="each worker in a pod-like sandbox (as in pods)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a dry run of the pipeline")
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    ap.add_argument("--scratch", type=Path, default=Path("/dev/shm/podsnap-bench"), help="weights file + artifacts")
    ap.add_argument("--out", type=Path, default=None, help="JSON file (default $OUT/bench.json or bench/results/)")
    ap.add_argument(
        "--thp",
        choices=("keep", "always", "madvise", "never"),
        default="keep",
        help="set transparent huge pages for the run (this machine's kernel; restored afterwards)",
    )
    ap.add_argument("--budget-s", type=float, default=450.0, help="skip cases that would start after this many s")
    ap.add_argument(
        "--no-cached-restore",
        dest="cached_restore",
        action="store_false",
        help="skip each case's second restore with verified_digests (as from the node-local cache)",
    )
    ap.add_argument(
        "--drop-file-from-gib",
        type=float,
        default=16.0,
        help="transparent cases from this size free the tmpfs weights file before their capture",
    )
    a = ap.parse_args()
    t_start = time.monotonic()
    sizes = [float(s) for s in a.sizes.split(",") if s]
    variants = [v for v in a.variants.split(",") if v]
    paths = [p for p in a.paths.split(",") if p]
    if bad := [v for v in variants if v not in {"eager", "compile"}]:
        ap.error(f"--variants: unknown {bad}; use eager and/or compile")
    if bad := [p for p in paths if p not in PATHS]:
        ap.error(f"--paths: unknown {bad}; use {', '.join(PATHS)}")
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
        "targets": TARGETS,
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
        return run_cases(a, doc, out, plan(sizes, paths, variants), t_start=t_start)
    finally:
        if thp_before is not None:
            thp_file.write_text(thp_before)


def run_cases(
    a: argparse.Namespace, doc: dict[str, Any], out: Path, cases: list[tuple[float, str, str]], *, t_start: float
) -> int:
    def save() -> None:
        doc["elapsed_s"] = time.monotonic() - t_start
        out.write_text(json.dumps(doc, indent=1))

    cuda = a.device == "cuda"
    doc["pinned_h2d_GBps"] = pinned_h2d_gbps() if cuda else None
    if cuda:
        print(f"pinned host->device: {doc['pinned_h2d_GBps']:.1f} GB/s (the floor)", flush=True)
    save()
    shutil.rmtree(a.scratch, ignore_errors=True)
    a.scratch.mkdir(parents=True)
    weights = a.scratch / "weights.bin"
    doc["weights_file_writes"] = []
    biggest = max(c[0] for c in cases)

    def ensure_weights(size: float) -> None:
        """One file serves every size (a worker reads its prefix); rewritten when a large case freed it."""
        if not cuda or (weights.exists() and weights.stat().st_size >= int(size * GIB)):
            return
        t = time.monotonic()
        subprocess.run(
            [
                *(sys.executable, "-m", "podsnap.demo", "--device", "cuda", "--write-weights", str(weights)),
                *("--weights-gib", str(biggest), "--dtype", a.dtype),
            ],
            check=True,
            env={**os.environ, "PYTHONPATH": str(REPO / "python")},
        )
        took = time.monotonic() - t
        doc["weights_file_writes"].append({"bytes": weights.stat().st_size, "s": took})
        print(f"weights file {weights.stat().st_size / GIB:.1f} GiB written in {took:.1f}s", flush=True)

    def drop_weights() -> None:
        weights.unlink(missing_ok=True)

    env = {**os.environ, "PYTHONPATH": str(REPO / "python")}
    for size, path, variant in cases:
        elapsed = time.monotonic() - t_start
        if elapsed > a.budget_s:
            doc["cases"].append(
                {"weights_gib": size, "variant": variant, "path": path, "error": f"skipped: {elapsed:.0f}s used"}
            )
            save()
            continue
        args = ["--device", a.device, "--weights-gib", str(size)]
        args += ["--dtype", a.dtype, "--weights-file", str(weights)] if cuda else []
        args += ["--compile"] if variant == "compile" else []
        args += PATHS[path]
        work = a.scratch / f"{size:g}-{path}-{variant}"
        print(f"== {size:g} GiB {path} {variant}", flush=True)
        log = PhaseLog()
        try:
            ensure_weights(size)
            drop = path.startswith("transparent") and size >= a.drop_file_from_gib
            r = round_trip(
                work,
                args,
                port=free_port(),
                env=env,
                progress=lambda m: print(f"   {m}", flush=True),
                after_cold_start=drop_weights if drop else None,
                engine_progress=log,
                namespaces=a.namespaces,
                cached_restore=a.cached_restore,
                **PATH_OPTIONS.get(path, {}),
            )
            case = summarize(size, variant, path, r, log=log, h2d=doc["pinned_h2d_GBps"] or 0.0)
            case["targets"] = verdicts(case)
            if case["cached"]:
                case["targets_cached"] = verdicts(case, case["cached"])
            case["raw"] = r
            print("\n".join(case_lines(case)), flush=True)
        except Exception as e:
            traceback.print_exc()
            case = {"weights_gib": size, "variant": variant, "path": path, "error": f"{type(e).__name__}: {e}"[:4000]}
            case["phases_seen"] = log.phases
            # only failures bring their worker's log back: few files may come back from the device
            with contextlib.suppress(OSError):
                shutil.copy(work / "worker.log", out.parent / f"worker-{size:g}-{path}-{variant}.log")
        finally:
            shutil.rmtree(work, ignore_errors=True)
        doc["cases"].append(case)
        save()
    shutil.rmtree(a.scratch, ignore_errors=True)
    save()
    print(f"\nJSON: {out}\n")
    print(table(doc), flush=True)
    for c in doc["cases"]:
        if "error" not in c:
            print("\n".join(case_lines(c)))

    def exact(c: dict[str, Any]) -> bool:
        runs = [c, *([c["cached"]] if c.get("cached") else [])]
        return all(r["bit_exact"] and r["same_worker"] for r in runs)

    return 0 if all("error" not in c and exact(c) for c in doc["cases"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
