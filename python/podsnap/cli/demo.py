"""`podsnap demo`: cold-start the demo worker, capture it, restore it, and compare the two answers.

The steps are `podsnap.demo.round_trip` (the one round trip the tests and the GPU bench also use):
start `python -m podsnap.demo` detached with a control dir; ask a chat question; wait for
`ready-for-snapshot`; capture (CRIU ends the worker); check it is gone; restore; write
`restore-context.json` and `restore-complete`; ask again. The answer, the weights' checksum and the
init id must be the source's. Prints a timing table and writes it as JSON.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

from podsnap.cli.progress import GIB, ProgressPrinter, human_bytes


def _rate(nbytes: int, ms: float | None) -> str:
    return f"{nbytes / GIB / (ms / 1000):.2f} GiB/s" if ms else ""


def table(report: dict[str, Any]) -> str:
    cap, res = report["capture"], report["restore"]
    rows: list[tuple[str, str, str]] = [("cold start (launch -> first answer)", f"{report['coldStartS']:.2f} s", "")]
    for phase, ms in cap["timingsMs"].items():
        if phase == "total":
            continue
        rate = _rate(cap["bytesMemory"], ms) if phase == "criu_dump" else ""
        rows.append((f"capture: {phase}", f"{ms / 1000:.3f} s", rate))
    rows.append(("capture: total", f"{cap['timingsMs']['total'] / 1000:.3f} s", ""))
    for phase, ms in res["timingsMs"].items():
        if phase == "total":
            continue
        rate = (
            _rate(res["bytesTotal"], ms)
            if phase == "verify"
            else (_rate(cap["bytesMemory"], ms) if phase == "criu_restore" else "")
        )
        rows.append((f"restore: {phase}", f"{ms / 1000:.3f} s", rate))
    rows.append(("restore: engine total", f"{res['timingsMs']['total'] / 1000:.3f} s", ""))
    for hook, s in (report.get("resumeHooksS") or {}).items():
        rows.append((f"restore: resume hook {hook}", f"{s:.3f} s", ""))
    rows.append(("restore: resume (restore-complete -> answer)", f"{res['resumeS']:.3f} s", ""))
    rows.append(
        (
            "restore: total (-> first answer)",
            f"{report['restoreS']:.2f} s",
            _rate(cap["bytesMemory"], report["restoreS"] * 1000),
        )
    )
    rows.append(("artifact size", human_bytes(cap["bytesTotal"]), f"memory {human_bytes(cap['bytesMemory'])}"))
    rows.append(("restore / cold start", f"{report['restoreOverColdStart']:.2f}", ""))
    w = max(len(r[0]) for r in rows)
    lines = [f"{'phase':<{w}}  {'time':>10}  rate", f"{'-' * w}  {'-' * 10}  {'-' * 12}"]
    lines += [f"{a:<{w}}  {b:>10}  {c}" for a, b, c in rows]
    return "\n".join(lines)


def summary(args: argparse.Namespace, r: dict[str, Any]) -> dict[str, Any]:
    """The round trip's report in the `podsnap demo --json` shape."""
    before, after = r["before"], r["after"]
    same = r["bit_exact"] and r["same_worker"]
    restore = (after["health"].get("restore") or {}) if isinstance(after.get("health"), dict) else {}
    return {
        "device": args.device,
        "weightsGiB": args.weights_gib,
        "cooperative": bool(getattr(args, "cooperative", False)),
        "answer": before["answer"],
        "answerAfterRestore": r["restore"]["first_answer"],
        "initId": before["init_id"],
        "initIdAfterRestore": after["init_id"],
        "weightsChecksum": before["weights_checksum"],
        "weightsChecksumAfterRestore": after["weights_checksum"],
        "sameAnswerAndInitId": same,
        "coldStartS": round(r["cold_start_s"], 3),
        "restoreS": round(r["restore_s"], 3),
        "restoreOverColdStart": round(r["restore_over_cold"], 3),
        "resumeHooksS": {k: round(v, 3) for k, v in (restore.get("hook_s") or {}).items()},
        "capture": {
            "timingsMs": r["capture"]["timings_ms"],
            "bytesTotal": r["capture"]["bytes_total"],
            "bytesMemory": r["capture"]["bytes_memory"],
            "cudaPids": r["capture"]["cuda_pids"],
        },
        "restore": {
            "timingsMs": r["restore"]["timings_ms"],
            "bytesTotal": r["restore"]["bytes_total"],
            "pid": r["restore"]["pid"],
            "cudaPids": r["restore"]["cuda_pids"],
            "resumeS": round(r["restore"]["resume_s"], 3),
        },
    }


def say(msg: str) -> None:
    print(f"podsnap demo: {msg}", file=sys.stderr, flush=True)


def worker_args(args: argparse.Namespace) -> list[str]:
    out = ["--device", args.device]
    if args.weights_gib is not None:
        out += ["--weights-gib", str(args.weights_gib)]
    if getattr(args, "cooperative", False):
        out.append("--cooperative")
    return out + list(args.extra_arg)


def run_demo(args: argparse.Namespace) -> int:
    from podsnap.demo import QUESTION, RoundTripError, free_port, round_trip
    from podsnap.engine import EngineError

    own_dir = args.workdir is None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="podsnap-demo-")).absolute()
    try:
        r = round_trip(
            workdir,
            worker_args(args),
            port=free_port(),
            criu_binary=Path(args.criu) if args.criu else None,
            cold_start_timeout_s=args.timeout,
            keep=args.keep,
            progress=say,
            engine_progress=ProgressPrinter(prefix="  "),
            capture_extra={"demo": {"device": args.device}},
            context_env={"POD_NAME": socket.gethostname(), "POD_IP": "127.0.0.1"},
        )
    except (RoundTripError, EngineError, OSError) as exc:
        print(f"podsnap demo: FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        if own_dir and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    report = summary(args, r)
    report["question"] = QUESTION
    print(table(report))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
        say(f"wrote {args.json}")
    if not report["sameAnswerAndInitId"]:
        say(
            f"FAILED: the restored worker differs: answer {report['answerAfterRestore']!r} vs {report['answer']!r}, "
            f"init id {report['initIdAfterRestore']} vs {report['initId']}, weights checksum "
            f"{report['weightsChecksumAfterRestore']} vs {report['weightsChecksum']}"
        )
        return 1
    say(
        f"OK: same answer, weights and init id after restore ({report['restoreS']:.2f} s vs cold start "
        f"{report['coldStartS']:.2f} s)"
    )
    return 0
