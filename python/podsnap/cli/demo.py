"""`podsnap demo`: cold-start the demo worker, capture it, restore it, and compare the two answers.

Steps: start `python -m podsnap.demo` detached (setsid, so init adopts it: a restore needs its PID
free, not held by our zombie) with a control dir; ask a chat question; wait for `ready-for-snapshot`;
capture (CRIU ends the worker); check it is gone; restore; write `restore-context.json` and
`restore-complete`; ask again. The answer and the init id must be the source's. Prints a timing table
and writes it as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from podsnap import contract
from podsnap.cli.progress import GIB, ProgressPrinter, human_bytes

QUESTION = "What does podsnap do for a GPU inference worker?"


class DemoError(Exception):
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _request(url: str, body: dict[str, Any] | None = None, timeout: float = 60.0) -> dict[str, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        out: dict[str, Any] = json.loads(r.read())
        return out


def ask(port: int) -> tuple[str, str, list[int]]:
    """(answer, init id, tokens) of one greedy chat completion."""
    resp = _request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        {"model": "podsnap-demo", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 24},
    )
    meta = resp.get("podsnap") or {}
    return str(resp["choices"][0]["message"]["content"]), str(meta.get("init_id", "")), list(meta.get("tokens") or [])


def wait_until(what: str, check: Any, timeout: float, alive_pid: int | None = None, log: Path | None = None) -> float:
    """Poll `check()` until truthy; return seconds waited; DemoError on timeout or if `alive_pid` dies."""
    t0 = time.monotonic()
    while True:
        with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
            if check():
                return time.monotonic() - t0
        if alive_pid is not None and not Path(f"/proc/{alive_pid}").exists():
            tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
            raise DemoError(f"the worker (pid {alive_pid}) exited while waiting for {what}\n{tail}")
        if time.monotonic() - t0 > timeout:
            raise DemoError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


def start_worker(args: argparse.Namespace, workdir: Path, port: int) -> tuple[int, Path, Path]:
    """Launch the demo worker detached; return (pid, control dir, log path)."""
    ctl = workdir / "control"
    ctl.mkdir(parents=True, exist_ok=True)
    log = workdir / "worker.log"
    pidfile = workdir / "worker.pid"
    cmd = [sys.executable, "-m", "podsnap.demo", "--host", "127.0.0.1", "--port", str(port), "--device", args.device]
    if args.weights_gib is not None:
        cmd += ["--weights-gib", str(args.weights_gib)]
    cmd += list(args.extra_arg)
    env = {**os.environ, contract.ENV_CONTROL_DIR: str(ctl)}
    # setsid -f forks: the shell's parent exits at once and init adopts the worker; `exec` keeps the PID
    script = f'echo $$ > "{pidfile}"; exec "$@" </dev/null >>"{log}" 2>&1'
    subprocess.run(["setsid", "-f", "sh", "-c", script, "sh", *cmd], check=True, env=env)
    wait_until("the worker's pid file", lambda: pidfile.exists() and pidfile.read_text().strip(), 30)
    return int(pidfile.read_text()), ctl, log


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


def say(msg: str) -> None:
    print(f"podsnap demo: {msg}", file=sys.stderr, flush=True)


def run_demo(args: argparse.Namespace) -> int:
    from podsnap.engine import CaptureOptions, EngineError, RestoreOptions, capture, restore
    from podsnap.engine.proctree import exists, kill_tree, wait_gone

    own_dir = args.workdir is None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="podsnap-demo-")).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    artifact = workdir / "artifact"
    if artifact.exists():
        shutil.rmtree(artifact)
    port = _free_port()
    criu_binary = Path(args.criu) if args.criu else None
    pid: int | None = None
    progress = ProgressPrinter(prefix="  ")
    try:
        say(f"starting the demo worker (device {args.device}, port {port}, logs {workdir / 'worker.log'})")
        t0 = time.monotonic()
        pid, ctl, log = start_worker(args, workdir, port)
        health = f"http://127.0.0.1:{port}/health"
        wait_until("the worker to serve", lambda: _request(health, timeout=2)["status"] == "ok", args.timeout, pid, log)
        answer, init_id, tokens = ask(port)
        cold_start = time.monotonic() - t0
        say(f"cold start {cold_start:.2f} s; pid {pid}, init id {init_id}; answer {answer!r}")
        wait_until(contract.FILE_READY_FOR_SNAPSHOT, (ctl / contract.FILE_READY_FOR_SNAPSHOT).exists, 120, pid, log)
        say("ready-for-snapshot; capturing")
        cap = capture(
            pid,
            artifact,
            CaptureOptions(criu_binary=criu_binary, extra={"demo": {"device": args.device, "initId": init_id}}),
            progress=progress,
        )
        if exists(pid):
            raise DemoError(f"the source (pid {pid}) is still there after the capture")
        say(f"captured {human_bytes(cap.bytes_total)} into {artifact}; the source is gone; restoring")
        t1 = time.monotonic()
        res = restore(artifact, RestoreOptions(criu_binary=criu_binary), progress=progress)
        pid = res.pid
        t_resume = time.monotonic()
        ctx = contract.RestoreContext(env={"POD_NAME": socket.gethostname(), "POD_IP": "127.0.0.1"})
        (ctl / contract.FILE_RESTORE_CONTEXT).write_text(ctx.to_json())
        (ctl / contract.FILE_RESTORE_COMPLETE).write_text("")
        wait_until(
            "the restored worker to resume", lambda: _request(health, timeout=2).get("restored") is True, 60, pid, log
        )
        answer2, init_id2, tokens2 = ask(port)
        t_end = time.monotonic()
        restore_s, resume_s = t_end - t1, t_end - t_resume
        same = answer2 == answer and tokens2 == tokens and init_id2 == init_id
        report: dict[str, Any] = {
            "device": args.device,
            "weightsGiB": args.weights_gib,
            "question": QUESTION,
            "answer": answer,
            "answerAfterRestore": answer2,
            "initId": init_id,
            "initIdAfterRestore": init_id2,
            "sameAnswerAndInitId": same,
            "coldStartS": round(cold_start, 3),
            "restoreS": round(restore_s, 3),
            "restoreOverColdStart": round(restore_s / cold_start, 3) if cold_start else None,
            "capture": {
                "timingsMs": cap.timings_ms,
                "bytesTotal": cap.bytes_total,
                "bytesMemory": cap.bytes_memory,
                "cudaPids": list(cap.cuda_pids),
            },
            "restore": {
                "timingsMs": res.timings_ms,
                "bytesTotal": res.bytes_total,
                "pid": res.pid,
                "cudaPids": list(res.cuda_pids),
                "resumeS": round(resume_s, 3),
            },
        }
        print(table(report))
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
            say(f"wrote {args.json}")
        if not same:
            raise DemoError(
                f"the restored worker answered differently: {answer2!r} (init id {init_id2}) vs {answer!r} ({init_id})"
            )
        say(f"OK: same answer and init id after restore ({restore_s:.2f} s vs cold start {cold_start:.2f} s)")
        return 0
    except (DemoError, EngineError, OSError, urllib.error.URLError) as exc:
        print(f"podsnap demo: FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        if pid is not None and not args.keep and exists(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            if not wait_gone(pid, timeout_s=5):
                kill_tree([pid])
        if own_dir and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
