"""The placeholder a restore pod's target container runs (operator/placeholder.py), run by a real /bin/sh
with a real control directory and real processes standing in for the restored worker."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from podsnap import contract as c
from podsnap.agent.on_pod import _claim
from podsnap.controldir import ControlDir
from podsnap.operator import placeholder
from tests.support.waiting import wait_for

#: the original command: says it started cold, and whether it still sees the control dir
ORIGINAL = ["sh", "-c", f'echo "cold-start control=${{{c.ENV_CONTROL_DIR}:-unset}}"']


class Placeholder:
    def __init__(
        self, control: Path, log: Path, timeout_s: int = 600, *, max_s: int = 900, policy: str | None = None
    ) -> None:
        self.log = log
        env = {
            "PATH": os.environ["PATH"],
            c.ENV_CONTROL_DIR: str(control),
            c.ENV_RESTORE_TIMEOUT: str(timeout_s),
            c.ENV_RESTORE_MAX: str(max_s),
        }
        if policy is not None:
            env[c.ENV_RESTORE_FAILURE_POLICY] = policy
        with log.open("ab") as out:
            self.proc = subprocess.Popen(placeholder.command(ORIGINAL), env=env, stdout=out, stderr=out)

    def output(self) -> str:
        return self.log.read_text()

    def wait(self, timeout: float = 30) -> int:
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def control(tmp_path: Path) -> Path:
    d = tmp_path / "snapshot-control"
    d.mkdir()
    return d


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[Placeholder | subprocess.Popen[bytes]]]:
    procs: list[Placeholder | subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if isinstance(p, Placeholder):
            p.stop()
        elif p.poll() is None:
            p.kill()
            p.wait()


def restored(control: Path, worker: int) -> None:
    """What the agent writes after a restore: the worker's PID, then restore-complete."""
    (control / c.FILE_WORKER_PID).write_text(f"{worker}\n")
    (control / c.FILE_RESTORE_COMPLETE).write_text("1\n")


def test_the_container_ends_when_the_restored_worker_dies_and_its_restart_starts_cold(
    control: Path, tmp_path: Path, started: list
) -> None:
    worker = subprocess.Popen(["sleep", "300"])
    started.append(worker)
    first = Placeholder(control, tmp_path / "first.log")
    started.append(first)
    restored(control, worker.pid)
    wait_for(lambda: f"watching the worker (pid {worker.pid})" in first.output(), what="the placeholder watching")
    t0 = time.monotonic()
    worker.kill()
    worker.wait()
    assert first.wait(timeout=10) == 1, first.output()
    # the wrapper polls /proc once a second; 15 s leaves room for a loaded host, far below any timeout
    assert time.monotonic() - t0 < 15, "the container must end within seconds of its worker"
    assert (control / c.FILE_WORKER_EXITED).exists()

    second = Placeholder(control, tmp_path / "second.log")  # the kubelet restarts the container
    started.append(second)
    assert second.wait() == 0
    out = second.output()
    assert "the restored worker exited earlier; starting the worker cold" in out
    assert "cold-start control=unset" in out, "a cold start must not make an SDK worker wait for a checkpoint"
    assert (control / c.FILE_STARTED_COLD).exists()


def test_a_failed_restore_starts_the_original_command_cold(control: Path, tmp_path: Path, started: list) -> None:
    p = Placeholder(control, tmp_path / "p.log")
    started.append(p)
    wait_for((control / c.FILE_PLACEHOLDER_STARTED).exists, what="the placeholder waiting")
    (control / c.FILE_RESTORE_FAILED).write_text("RestoreFailed: no such artifact\n")
    assert p.wait() == 0
    assert "the restore failed: RestoreFailed: no such artifact; starting the worker cold" in p.output()
    assert "cold-start control=unset" in p.output()


def test_no_restore_within_the_timeout_starts_cold(control: Path, tmp_path: Path, started: list) -> None:
    p = Placeholder(control, tmp_path / "p.log", timeout_s=1)
    started.append(p)
    assert p.wait() == 0
    assert "no restore began within 1 s; starting the worker cold" in p.output()


def test_a_restore_under_way_outlasts_the_timeout(control: Path, tmp_path: Path, started: list) -> None:
    ctl = ControlDir(control)
    assert _claim(ctl), "nothing started cold yet: the agent may restore"
    p = Placeholder(control, tmp_path / "p.log", timeout_s=1)
    started.append(p)
    # past the timeout, the placeholder still waits for the restore the agent announced...
    wait_for(lambda: "but one is under way: waiting for it" in p.output(), what="the placeholder past its timeout")
    assert p.proc.poll() is None and not (control / c.FILE_STARTED_COLD).exists(), p.output()
    worker = subprocess.Popen(["sleep", "300"])
    started.append(worker)
    # ...and takes it when it completes
    restored(control, worker.pid)
    wait_for(lambda: f"watching the worker (pid {worker.pid})" in p.output(), what="the placeholder watching")
    assert "cold-start" not in p.output()


def test_the_agent_backs_off_once_the_placeholder_started_cold(control: Path, tmp_path: Path, started: list) -> None:
    p = Placeholder(control, tmp_path / "p.log", timeout_s=1)
    started.append(p)
    assert p.wait() == 0
    assert not _claim(ControlDir(control)), "the container already runs its command cold"
    assert not (control / c.FILE_RESTORING).exists()


def test_under_fail_a_failed_restore_holds_and_never_starts_the_command(
    control: Path, tmp_path: Path, started: list
) -> None:
    p = Placeholder(control, tmp_path / "p.log", policy=c.RESTORE_FAILURE_FAIL)
    started.append(p)
    wait_for((control / c.FILE_PLACEHOLDER_STARTED).exists, what="the placeholder waiting")
    (control / c.FILE_RESTORE_FAILED).write_text("RestoreIncompatible: gate kernel\n")
    wait_for(lambda: "restoreFailurePolicy is Fail" in p.output(), what="the placeholder holding")
    assert p.proc.poll() is None and "cold-start" not in p.output(), p.output()
    assert not (control / c.FILE_STARTED_COLD).exists(), "the startup probe must keep failing"
    p.stop()
    # its restart (the startup probe ran out) holds again
    again = Placeholder(control, tmp_path / "again.log", policy=c.RESTORE_FAILURE_FAIL)
    started.append(again)
    wait_for(lambda: "the restore failed earlier" in again.output(), what="the restarted placeholder holding")
    assert again.proc.poll() is None and "cold-start" not in again.output()


def test_under_fail_the_pickup_timeout_waits_for_the_agent(control: Path, tmp_path: Path, started: list) -> None:
    p = Placeholder(control, tmp_path / "p.log", timeout_s=1, policy=c.RESTORE_FAILURE_FAIL)
    started.append(p)
    wait_for(lambda: "waiting for the agent" in p.output(), what="the placeholder past its pickup timeout")
    assert p.proc.poll() is None and not (control / c.FILE_STARTED_COLD).exists()
    worker = subprocess.Popen(["sleep", "300"])
    started.append(worker)
    restored(control, worker.pid)  # a late restore is still taken
    wait_for(lambda: f"watching the worker (pid {worker.pid})" in p.output(), what="the placeholder watching")


def test_a_restore_that_outlasts_its_maximum_ends_the_container_and_the_restart_starts_cold(
    control: Path, tmp_path: Path, started: list
) -> None:
    assert _claim(ControlDir(control))
    p = Placeholder(control, tmp_path / "p.log", timeout_s=1, max_s=2)
    started.append(p)
    assert p.wait() == 1, p.output()
    assert "the restore did not finish within 2 s" in p.output()
    assert (control / c.FILE_RESTORE_TIMED_OUT).exists()
    again = Placeholder(control, tmp_path / "again.log", timeout_s=1, max_s=2)
    started.append(again)
    assert again.wait() == 0
    assert "the restore did not finish within 2 s; starting the worker cold" in again.output()
    assert "cold-start control=unset" in again.output()


def test_pod_deletion_terminates_the_restored_worker_through_the_placeholder(
    control: Path, tmp_path: Path, started: list
) -> None:
    got_term = tmp_path / "got-term"
    worker = subprocess.Popen(["sh", "-c", f"trap 'echo term > {got_term}; exit 0' TERM; while :; do sleep 0.1; done"])
    started.append(worker)
    p = Placeholder(control, tmp_path / "p.log")
    started.append(p)
    restored(control, worker.pid)
    wait_for(lambda: "watching the worker" in p.output(), what="the placeholder watching")
    p.proc.send_signal(signal.SIGTERM)
    wait_for(got_term.exists, what="SIGTERM passed on to the worker")
    worker.wait(10)  # reaped, as the pod's PID 1 (pause) reaps it
    assert p.wait() == 0, p.output()
    assert not (control / c.FILE_WORKER_EXITED).exists(), "a deleted pod's worker did not die on its own"


@pytest.mark.parametrize(
    ("files", "ready"),
    [((), False), ((c.FILE_RESTORE_COMPLETE,), True), ((c.FILE_STARTED_COLD,), True), ((c.FILE_RESTORING,), False)],
)
def test_the_startup_probe_passes_once_restored_or_started_cold(
    control: Path, files: tuple[str, ...], ready: bool
) -> None:
    for name in files:
        (control / name).write_text("1\n")
    env = {"PATH": os.environ["PATH"], c.ENV_CONTROL_DIR: str(control)}
    got = subprocess.run(["sh", "-c", placeholder.STARTUP_PROBE_SCRIPT], env=env, check=False)
    assert (got.returncode == 0) is ready
