"""The single-host contract flow with two commands: `podsnap capture --control-dir` and `podsnap restore
--control-dir --context`, on a worker that uses only the file protocol and imports nothing from podsnap.

Real CRIU on a real process (root + CRIU, else skipped by the shared fixture).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from podsnap.engine import Criu

WORKER = Path(__file__).resolve().parent / "contract_worker.py"


class ContractWorker:
    """The worker, started detached (re-parented to init: a restore needs its PID free, not held by our zombie)."""

    def __init__(self, tmp: Path, warmup_s: float = 1.0) -> None:
        self.control = tmp / "control"
        self.control.mkdir(parents=True)
        self.result = tmp / "result.json"
        pidfile = tmp / "pid"
        # -I: isolated mode, no PYTHONPATH, no user site: podsnap cannot even be imported by accident
        script = (
            f'echo $$ > "{pidfile}"; exec "{sys.executable}" -I "{WORKER}" "{self.result}" </dev/null >"{tmp}/log" 2>&1'
        )
        env = {"PATH": os.environ["PATH"], "SNAPSHOT_CONTROL_DIR": str(self.control), "WARMUP_S": str(warmup_s)}
        subprocess.run(["setsid", "-f", "sh", "-c", script], check=True, env=env)
        deadline = time.monotonic() + 10
        while not (pidfile.exists() and pidfile.read_text().strip()):
            assert time.monotonic() < deadline, "the worker did not start"
            time.sleep(0.01)
        self.pid = int(pidfile.read_text())
        self.log = tmp / "log"

    def alive(self) -> bool:
        try:
            state = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        return state != "Z"

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


def podsnap(*args: str, criu: Criu | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if criu is not None:
        env["PODSNAP_CRIU"] = str(criu.binary.exe)
    return subprocess.run(
        [sys.executable, "-m", "podsnap.cli", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def wait_for_file(path: Path, timeout: float, worker: ContractWorker) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear; worker log:\n{worker.log.read_text()}"
        time.sleep(0.05)


@pytest.fixture
def worker(tmp_path: Path) -> ContractWorker:
    w = ContractWorker(tmp_path)
    yield w  # type: ignore[misc]
    w.kill()


@pytest.mark.slow
def test_a_contract_worker_is_captured_and_restored_with_two_commands(
    criu: Criu, worker: ContractWorker, tmp_path: Path
) -> None:
    artifact = tmp_path / "artifact"
    # started at once: capture must wait for the worker's warm-up (ready-for-snapshot), with progress
    cap = podsnap(
        "capture", "--pid", str(worker.pid), "--out", str(artifact), "--control-dir", str(worker.control), criu=criu
    )
    assert cap.returncode == 0, cap.stderr
    assert "waiting for pid" in cap.stderr and "ready-for-snapshot" in cap.stderr
    assert not worker.alive(), "the capture ends the source"
    assert not worker.result.exists()
    res = podsnap(
        "restore",
        str(artifact),
        "--control-dir",
        str(worker.control),
        "--context",
        "POD_IP=10.9.8.7",
        "--context",
        "POD_NAME=restored=yes",
        criu=criu,
    )
    assert res.returncode == 0, res.stderr
    assert int(res.stdout.strip()) == worker.pid
    wait_for_file(worker.result, 30, worker)
    result = json.loads(worker.result.read_text())
    assert result["pid"] == worker.pid
    assert result["digest_after"] == result["digest_before"], "the worker's memory changed across the restore"
    assert result["ticks_after"] != result["ticks_before"], "not a restored process: it was never captured"
    assert result["env"] == {"POD_IP": "10.9.8.7", "POD_NAME": "restored=yes"}
    assert result["podsnap_modules"] == []


@pytest.mark.slow
def test_a_restore_that_cannot_signal_the_worker_kills_it(criu: Criu, worker: ContractWorker, tmp_path: Path) -> None:
    artifact = tmp_path / "artifact"
    cap = podsnap(
        "capture", "--pid", str(worker.pid), "--out", str(artifact), "--control-dir", str(worker.control), criu=criu
    )
    assert cap.returncode == 0, cap.stderr
    res = podsnap("restore", str(artifact), "--control-dir", str(tmp_path / "not-there"), criu=criu)
    assert res.returncode == 1
    assert "could not be told to resume" in res.stderr and "killed" in res.stderr
    assert not worker.alive(), "a restored worker that will never be signalled must not be left waiting"


def test_capture_gives_up_on_a_worker_that_never_gets_ready(tmp_path: Path) -> None:
    w = ContractWorker(tmp_path, warmup_s=60)
    try:
        cap = podsnap(
            "capture",
            "--pid",
            str(w.pid),
            "--out",
            str(tmp_path / "a"),
            "--control-dir",
            str(w.control),
            "--ready-timeout",
            "0.5",
        )
        assert cap.returncode == 1
        assert "did not appear within 0.5 s" in cap.stderr and "--ready-timeout" in cap.stderr
        assert w.alive(), "nothing was captured: the worker keeps running"
        assert not (tmp_path / "a").exists()
    finally:
        w.kill()


def test_capture_stops_waiting_when_the_worker_exits(tmp_path: Path) -> None:
    w = ContractWorker(tmp_path, warmup_s=60)
    t = time.monotonic()
    w.kill()
    cap = podsnap("capture", "--pid", str(w.pid), "--out", str(tmp_path / "a"), "--control-dir", str(w.control))
    assert cap.returncode == 1
    assert f"pid {w.pid} exited before it wrote ready-for-snapshot" in cap.stderr
    assert time.monotonic() - t < 60
