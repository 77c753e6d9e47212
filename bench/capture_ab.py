"""Capture by an earlier podsnap and by this tree, side by side in one run (issue 9: "capture is no slower").

Each case is one whole round trip of the demo worker (cold start -> capture -> restore -> bit-exact check)
run by one tree in its own subprocess, with that tree's python/ alone on PYTHONPATH: its worker, its
engine and its round trip, so the baseline side is exactly the earlier revision, not an imitation of it.
The sides alternate A B B A A B ... so drift of the machine during the run (page cache, the driver's
checkpoint speed, which varies by more than a second from run to run) falls on both. Every case reads
its weights from one tmpfs file written once (page cache), as in bench/gpu_bench.py.

Reported per side: median capture wall time and each engine phase's median (the engines' own
timings_ms), restore wall time, bit-exactness; and the ratio this tree / baseline.

usage: bench/capture_ab.py --baseline DIR [--rounds 3] [--weights-gib 8] [--device cuda|cpu] [--budget-s 300]
  DIR: a tree of the earlier revision with its python/ (e.g. `git archive 20d7bde python | tar -x -C DIR`)
  JSON: $OUT/capture-ab.json when OUT is set, else bench/results/capture-ab-<time>.json
CPU dry run (no GPU; numpy weights generated in the worker): --device cpu --weights-gib 0.25
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MARK = "PODSNAP-AB-RESULT "
#: run in the case's subprocess: the tree's own round trip, its report's timings back as one JSON line
CASE = """
import json, sys
from pathlib import Path
from podsnap.demo._roundtrip import round_trip
mark, work, port, args = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
r = round_trip(work, args, port=port)
cap = r.get("capture", {})
print(mark + json.dumps({
    "cold_start_s": r["cold_start_s"], "capture_s": r["capture_s"], "restore_s": r["restore_s"],
    "capture_ms": cap.get("timings_ms", {}), "bytes_total": cap.get("bytes_total"),
    "bytes_memory": cap.get("bytes_memory"), "digest": cap.get("digest"), "gpu_bytes": r.get("gpu_bytes"),
    "bit_exact": r["bit_exact"], "same_worker": r["same_worker"],
}), flush=True)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def order(rounds: int) -> list[str]:
    """baseline, current, current, baseline, baseline, current, ...: each side first as often as second."""
    pairs = [("baseline", "current"), ("current", "baseline")]
    return [side for i in range(rounds) for side in pairs[i % 2]]


def run_case(tree: Path, work: Path, worker_args: list[str], timeout_s: float) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # the carried site packages (e.g. blake3 on the GPU machine) stay; the tree's python/ comes first
    extra = [p for p in os.environ.get("PODSNAP_AB_PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "python"), *extra])
    shutil.rmtree(work, ignore_errors=True)
    p = subprocess.run(
        [sys.executable, "-c", CASE, MARK, str(work), str(free_port()), *worker_args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    shutil.rmtree(work, ignore_errors=True)
    for line in p.stdout.splitlines():
        if line.startswith(MARK):
            return dict(json.loads(line[len(MARK) :]))
    raise RuntimeError(f"case exited {p.returncode}: {(p.stdout + p.stderr)[-2000:]}")


def median_phases(cases: list[dict[str, Any]]) -> dict[str, float]:
    names = sorted({n for c in cases for n in c["capture_ms"] if n != "total"})
    return {n: statistics.median(c["capture_ms"].get(n, 0.0) for c in cases) / 1000 for n in names}


def summary(cases: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for side in ("baseline", "current"):
        done = [c for c in cases if c["side"] == side and "error" not in c]
        if not done:
            continue
        out[side] = {
            "cases": len(done),
            "capture_s_median": statistics.median(c["capture_s"] for c in done),
            "capture_s_all": [round(c["capture_s"], 3) for c in done],
            "capture_phases_s_median": median_phases(done),
            "restore_s_median": statistics.median(c["restore_s"] for c in done),
            "cold_start_s_median": statistics.median(c["cold_start_s"] for c in done),
            "all_bit_exact": all(c["bit_exact"] and c["same_worker"] for c in done),
        }
    if "baseline" in out and "current" in out:
        out["capture_current_over_baseline"] = out["current"]["capture_s_median"] / out["baseline"]["capture_s_median"]
        out["restore_current_over_baseline"] = out["current"]["restore_s_median"] / out["baseline"]["restore_s_median"]
    return out


def report(doc: dict[str, Any]) -> str:
    s = doc["summary"]
    lines = [
        f"{'side':<9} {'n':>2} {'capture s (median)':>18} {'all':<28} {'restore s':>9} {'exact':>5}  phases (median s)"
    ]
    for side in ("baseline", "current"):
        if side not in s:
            continue
        x = s[side]
        phases = " ".join(f"{k} {v:.2f}" for k, v in x["capture_phases_s_median"].items() if v >= 0.01)
        lines.append(
            f"{side:<9} {x['cases']:>2} {x['capture_s_median']:>18.2f} {' '.join(map(str, x['capture_s_all'])):<28} "
            f"{x['restore_s_median']:>9.2f} {'yes' if x['all_bit_exact'] else 'NO':>5}  {phases}"
        )
    if "capture_current_over_baseline" in s:
        lines.append(
            f"capture current / baseline {s['capture_current_over_baseline']:.3f}; "
            f"restore current / baseline {s['restore_current_over_baseline']:.3f}"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--baseline", type=Path, required=True, help="a tree of the earlier revision (its python/)")
    ap.add_argument("--rounds", type=int, default=3, help="pairs of cases (default 3: six round trips)")
    ap.add_argument("--weights-gib", type=float, default=8.0)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    ap.add_argument("--scratch", type=Path, default=Path("/dev/shm/podsnap-ab"), help="weights file + artifacts")
    ap.add_argument("--budget-s", type=float, default=300.0, help="start no case after this many s")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    if not (a.baseline / "python" / "podsnap" / "demo").is_dir():
        ap.error(f"--baseline: {a.baseline}/python/podsnap/demo not found; extract the revision's python/ there")
    if a.out is not None:
        out = a.out
    elif os.environ.get("OUT"):
        out = Path(os.environ["OUT"]) / "capture-ab.json"
    else:
        out = REPO / "bench" / "results" / f"capture-ab-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    trees = {"baseline": a.baseline.resolve(), "current": REPO}
    doc: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "baseline_tree": str(trees["baseline"]),
        "baseline_revision": (a.baseline / "REVISION").read_text().strip()
        if (a.baseline / "REVISION").exists()
        else None,
        "kernel": os.uname().release,
        "cases": [],
    }
    shutil.rmtree(a.scratch, ignore_errors=True)
    a.scratch.mkdir(parents=True)
    args = ["--device", a.device, "--weights-gib", str(a.weights_gib)]
    if a.device == "cuda":
        weights = a.scratch / "weights.bin"
        t = time.monotonic()
        subprocess.run(
            [
                *(sys.executable, "-m", "podsnap.demo", "--device", "cuda", "--write-weights", str(weights)),
                *("--weights-gib", str(a.weights_gib), "--dtype", a.dtype),
            ],
            check=True,
            env={**os.environ, "PYTHONPATH": str(REPO / "python")},
        )
        doc["weights_file_s"] = time.monotonic() - t
        args += ["--dtype", a.dtype, "--weights-file", str(weights)]
    for i, side in enumerate(order(a.rounds)):
        elapsed = time.monotonic() - t0
        if elapsed > a.budget_s:
            doc["cases"].append({"side": side, "error": f"skipped: {elapsed:.0f}s used"})
            continue
        print(f"== case {i + 1}: {side}", flush=True)
        try:
            case = run_case(trees[side], a.scratch / f"case-{i}", args, timeout_s=600)
        except Exception as e:  # one failed case must not lose the others' figures
            case = {"error": f"{type(e).__name__}: {e}"[-3000:]}
        case = {"side": side, **case}
        if "error" in case:
            print(f"   ERROR {case['error']}", flush=True)
        else:
            print(
                f"   capture {case['capture_s']:.2f}s restore {case['restore_s']:.2f}s exact {case['bit_exact']}",
                flush=True,
            )
        doc["cases"].append(case)
        doc["summary"] = summary(doc["cases"])
        doc["elapsed_s"] = time.monotonic() - t0
        out.write_text(json.dumps(doc, indent=1))
    shutil.rmtree(a.scratch, ignore_errors=True)
    doc["summary"] = summary(doc["cases"])
    out.write_text(json.dumps(doc, indent=1))
    print(f"\nJSON: {out}\n{report(doc)}", flush=True)
    done = [c for c in doc["cases"] if "error" not in c]
    return 0 if done and all(c["bit_exact"] and c["same_worker"] for c in done) else 1


if __name__ == "__main__":
    raise SystemExit(main())
