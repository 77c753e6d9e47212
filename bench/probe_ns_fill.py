"""Probe: does the source's teardown slow the next restore's fill in namespace mode? (one GPU call, ~2 min)

The bench restores right after the capture. In namespace mode the capture's `reap` is 0 s (the sandbox's
init reaps at once), so the dead source's teardown might overlap the restore's fill. This runs the 8 GiB
eager demo round trip in namespace mode four times, alternately with and without a pause of `--delay-s`
between capture and restore (outside the restore's timing), and writes each restore's phases.

usage: PODSNAP_CRIU=... python3 bench/probe_ns_fill.py [--delay-s 6] [--weights-gib 8]
JSON: $OUT/nsfill.json (else bench/results/nsfill.json)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))

from podsnap import engine  # noqa: E402
from podsnap.demo import _roundtrip as rt  # noqa: E402
from podsnap.demo import free_port  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--delay-s", type=float, default=6.0)
    ap.add_argument("--weights-gib", default="8")
    a = ap.parse_args()
    out = (
        Path(os.environ["OUT"]) / "nsfill.json" if os.environ.get("OUT") else REPO / "bench" / "results" / "nsfill.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path("/dev/shm/podsnap-nsfill")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    weights = scratch / "weights.bin"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "python"), os.environ.get("PYTHONPATH", "")])}
    subprocess.run(
        [
            *(sys.executable, "-m", "podsnap.demo", "--device", "cuda", "--write-weights", str(weights)),
            *("--weights-gib", a.weights_gib, "--dtype", "float16"),
        ],
        check=True,
        env=env,
    )
    args = ["--device", "cuda", "--weights-gib", a.weights_gib, "--dtype", "float16", "--weights-file", str(weights)]
    real_capture = engine.capture
    results: list[dict[str, Any]] = []
    for i, delay in enumerate((0.0, a.delay_s, 0.0, a.delay_s)):

        def paused_capture(*pa: Any, _delay: float = delay, **kw: Any) -> Any:
            # round_trip imports capture when it runs: the pause lands between capture and restore
            result = real_capture(*pa, **kw)
            time.sleep(_delay)
            return result

        engine.capture = paused_capture
        try:
            r = rt.round_trip(scratch / f"case-{i}", args, port=free_port(), env=env, namespaces=True)
        finally:
            engine.capture = real_capture
            shutil.rmtree(scratch / f"case-{i}", ignore_errors=True)
        t, b = r["restore"]["timings_ms"], r["restore"].get("phase_bytes", {})
        row = {
            "delay_s": delay,
            "restore_s": r["restore_s"],
            "fill_ms": t.get("fill"),
            "fill_bytes": b.get("fill"),
            "cuda_restore_ms": t.get("cuda_restore"),
            "criu_restore_ms": t.get("criu_restore"),
            "capture_ms": r["capture"]["timings_ms"],
            "bit_exact": r["bit_exact"],
        }
        print(json.dumps(row), flush=True)
        results.append(row)
        out.write_text(json.dumps(results, indent=1))
    shutil.rmtree(scratch, ignore_errors=True)
    return 0 if all(x["bit_exact"] for x in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
