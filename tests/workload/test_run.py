"""`podsnap-run` as a real process: exit codes, signal forwarding, reaping, standby."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from podsnap import contract
from tests.support.processes import children_of

RUN = [sys.executable, "-m", "podsnap.workload.run"]


def env(**extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k != contract.ENV_RESTORE_STANDBY}
    e.update(extra)
    return e


def wait_for(path: Path, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)
    return path.read_text()


def zombies_of(pid: int) -> list[int]:
    out = []
    for child in children_of(pid):
        try:
            if (Path("/proc") / str(child) / "stat").read_text().split(") ")[1].startswith("Z"):
                out.append(child)
        except OSError:
            pass
    return out


def as_subreaper() -> list[str]:
    """podsnap-run started as a child subreaper, so orphans land on it as they would on PID 1."""
    launcher = (
        "import ctypes, os, sys; ctypes.CDLL(None).prctl(36, 1, 0, 0, 0); "
        "os.execv(sys.executable, [sys.executable, '-m', 'podsnap.workload.run', *sys.argv[1:]])"
    )
    return [sys.executable, "-c", launcher]


@pytest.mark.parametrize("code", [0, 3, 42])
def test_exits_with_the_childs_status(code: int) -> None:
    p = subprocess.run([*RUN, "--", "sh", "-c", f"exit {code}"], env=env(), timeout=30, check=False)
    assert p.returncode == code


def test_a_child_killed_by_a_signal_gives_128_plus_the_signal() -> None:
    p = subprocess.run([*RUN, "--", "sh", "-c", "kill -KILL $$"], env=env(), timeout=30, check=False)
    assert p.returncode == 128 + signal.SIGKILL


def test_sigterm_is_forwarded_and_the_childs_own_exit_code_wins(tmp_path: Path) -> None:
    started = tmp_path / "started"
    script = f"trap 'echo got-term > {tmp_path}/term; exit 7' TERM; echo $$ > {started}; while :; do sleep 0.05; done"
    p = subprocess.Popen([*RUN, "--", "sh", "-c", script], env=env())
    child = int(wait_for(started))
    assert child != p.pid, "the worker must not be the entrypoint process itself"
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=10) == 7
    assert (tmp_path / "term").read_text().strip() == "got-term"


def test_orphans_are_reaped_while_the_child_runs(tmp_path: Path) -> None:
    # the child forks grandchildren and exits them without waiting; as a subreaper podsnap-run adopts
    # them (like PID 1 in a container) and must leave no zombie behind
    started = tmp_path / "started"
    orphans = tmp_path / "orphans"
    script = f"(sleep 0.1 & echo $! >> {orphans}) ; (sleep 0.1 & echo $! >> {orphans}) ; echo $$ > {started}; sleep 30"
    p = subprocess.Popen([*as_subreaper(), "--", "sh", "-c", script], env=env())
    wait_for(started)
    pids = [int(x) for x in orphans.read_text().split()]
    assert len(pids) == 2
    try:
        # a zombie keeps its /proc entry: gone means exited AND reaped, by podsnap-run (their reaper)
        deadline = time.monotonic() + 10
        while any(Path(f"/proc/{pid}").exists() for pid in pids):
            assert time.monotonic() < deadline, f"orphans not reaped: {zombies_of(p.pid)}"
            time.sleep(0.02)
        assert zombies_of(p.pid) == []
    finally:
        p.terminate()
        p.wait(timeout=10)


def test_no_command_is_a_usage_error() -> None:
    p = subprocess.run([*RUN], env=env(), capture_output=True, text=True, timeout=30, check=False)
    assert p.returncode == 2
    assert "usage: podsnap-run -- CMD" in p.stderr


def test_a_missing_command_exits_127_naming_it() -> None:
    p = subprocess.run(
        [*RUN, "--", "no-such-worker-binary"], env=env(), capture_output=True, text=True, timeout=30, check=False
    )
    assert p.returncode == 127
    assert "no-such-worker-binary: command not found" in p.stderr


def test_standby_runs_nothing_and_ends_on_sigterm(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    p = subprocess.Popen([*RUN, "--", "sh", "-c", f"touch {marker}"], env=env(**{contract.ENV_RESTORE_STANDBY: "1"}))
    wait_blocked(p.pid, signal.SIGTERM)  # in its wait loop: it got past the point where it would run CMD
    assert p.poll() is None, "standby exited on its own"
    assert not marker.exists(), "standby ran the command"
    assert children_of(p.pid) == []
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=10) == 128 + signal.SIGTERM


def test_standby_adopts_a_restored_worker_forwards_signals_and_exits_with_its_status(tmp_path: Path) -> None:
    """Stand-in for the agent's restore: a process re-parented onto the standby entrypoint.

    The agent's CRIU restore makes the worker a child of the container's PID 1; here the test makes
    podsnap-run a subreaper and double-forks a worker below it, which the kernel then re-parents to it.
    """
    hand_over = tmp_path / "hand-over"
    worker_pid = tmp_path / "worker-pid"
    launcher = (
        "import ctypes, os, subprocess, sys, time\n"
        "ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)\n"
        "if os.fork() == 0:\n"
        f"    while not os.path.exists({str(hand_over)!r}): time.sleep(0.02)\n"
        "    subprocess.Popen(['sh', '-c', "
        f"\"trap 'exit 5' TERM; echo $$ > {worker_pid}; while :; do sleep 0.05; done\"], start_new_session=True)\n"
        "    os._exit(0)\n"
        f"os.execv(sys.executable, [sys.executable, '-m', 'podsnap.workload.run', '--', 'false'])\n"
    )
    p = subprocess.Popen([sys.executable, "-c", launcher], env=env(**{contract.ENV_RESTORE_STANDBY: "1"}))
    wait_blocked(p.pid, signal.SIGTERM)  # podsnap-run is in its loop: signals are now its to forward
    hand_over.write_text("go")
    worker = int(wait_for(worker_pid))
    deadline = time.monotonic() + 5
    while worker not in children_of(p.pid):
        assert time.monotonic() < deadline, "the worker was not re-parented onto podsnap-run"
        time.sleep(0.02)
    assert p.poll() is None
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=10) == 5


def test_standby_timeout_cold_starts_the_command(tmp_path: Path) -> None:
    marker = tmp_path / "cold"
    p = subprocess.run(
        [*RUN, "--standby-timeout", "0.3", "--", "sh", "-c", f"echo cold > {marker}; exit 4"],
        env=env(**{contract.ENV_RESTORE_STANDBY: "true"}),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert p.returncode == 4
    assert marker.read_text().strip() == "cold"
    assert "no restore within 0.3s" in p.stderr


def pid1_run(args: list[str], env_extra: dict[str, str]) -> tuple[subprocess.Popen[bytes], int]:
    """podsnap-run as PID 1 of a fresh PID namespace (as in a container); returns (unshare, its host pid)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a PID namespace")
    u = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", *RUN, *args], env=env(**env_extra), stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 10
    while True:
        inner = [c for c in children_of(u.pid) if "podsnap.workload.run" in Path(f"/proc/{c}/cmdline").read_text()]
        if inner:
            status = Path(f"/proc/{inner[0]}/status").read_text()
            if "\nNSpid:" in status and status.split("\nNSpid:")[1].split("\n")[0].split()[-1] == "1":
                return u, inner[0]
        if u.poll() is not None:
            pytest.skip(f"unshare failed: {u.stderr.read().decode() if u.stderr else ''}")
        assert time.monotonic() < deadline, "podsnap-run never started as PID 1"
        time.sleep(0.02)


def test_as_pid_1_of_a_container_sigterm_reaches_the_worker(tmp_path: Path) -> None:
    started = tmp_path / "started"
    script = f"trap 'exit 9' TERM; echo $$ > {started}; while :; do sleep 0.05; done"
    u, pid1 = pid1_run(["--", "sh", "-c", script], {})
    assert wait_for(started).strip() == "2", "the worker must not be PID 1 of the namespace"
    os.kill(pid1, signal.SIGTERM)
    assert u.wait(timeout=10) == 9


def wait_blocked(pid: int, sig: int, timeout: float = 30) -> None:
    """Until `pid` blocks `sig` or waits for it in sigtimedwait (podsnap-run's first acts): before that, a
    PID 1 drops the signal unhandled. (Inside sigtimedwait the kernel unblocks the waited signals.)"""
    deadline = time.monotonic() + timeout
    while True:
        status = Path(f"/proc/{pid}/status").read_text()
        blocked = int(status.split("\nSigBlk:")[1].split()[0], 16)
        if blocked >> (sig - 1) & 1 or Path(f"/proc/{pid}/wchan").read_text().startswith("do_sigtimedwait"):
            return
        assert time.monotonic() < deadline, f"pid {pid} never blocked signal {sig}"
        time.sleep(0.01)


def test_as_pid_1_in_standby_sigterm_ends_the_placeholder() -> None:
    u, pid1 = pid1_run(["--", "false"], {contract.ENV_RESTORE_STANDBY: "1"})
    try:
        wait_blocked(pid1, signal.SIGTERM)
        assert u.poll() is None
        os.kill(pid1, signal.SIGTERM)
        assert u.wait(timeout=10) == 128 + signal.SIGTERM
    finally:
        if u.poll() is None:
            os.kill(pid1, signal.SIGKILL)
            u.wait(timeout=10)


def test_standby_starts_cold_at_once_when_the_restore_failed_and_the_worker_sees_no_control_dir(
    tmp_path: Path,
) -> None:
    control = tmp_path / "ctl"
    control.mkdir()
    out = tmp_path / "cold"
    p = subprocess.Popen(
        [*RUN, "--", "sh", "-c", f'echo "control=${{{contract.ENV_CONTROL_DIR}:-unset}}" > {out}'],
        env=env(**{contract.ENV_RESTORE_STANDBY: "1", contract.ENV_CONTROL_DIR: str(control)}),
        stderr=subprocess.PIPE,
        text=True,
    )
    (control / contract.FILE_RESTORE_FAILED).write_text("RestoreIncompatible: gate kernel\n")
    assert p.wait(timeout=10) == 0
    assert wait_for(out).strip() == "control=unset", "a cold worker must not wait for a checkpoint"
    assert (control / contract.FILE_STARTED_COLD).exists(), "the startup probe passes on a cold start"
    assert p.stderr is not None and "the restore failed: RestoreIncompatible: gate kernel" in p.stderr.read()


def test_standby_takes_its_timeout_from_the_restore_pods_variable_and_waits_for_a_restore_under_way(
    tmp_path: Path,
) -> None:
    control = tmp_path / "ctl"
    control.mkdir()
    (control / contract.FILE_RESTORING).write_text("1\n")  # the agent has begun a restore
    marker = tmp_path / "cold"
    extra = {
        contract.ENV_RESTORE_STANDBY: "1",
        contract.ENV_CONTROL_DIR: str(control),
        contract.ENV_RESTORE_TIMEOUT: "0.2",
    }
    p = subprocess.Popen([*RUN, "--", "sh", "-c", f"echo cold > {marker}"], env=env(**extra), stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:  # well past the timeout: a begun restore is waited for
            # (podsnap-started-cold may show for an instant: written before podsnap-restoring is looked for)
            assert p.poll() is None and not marker.exists()
            time.sleep(0.05)
        (control / contract.FILE_RESTORING).unlink()  # the restore is abandoned
        assert p.wait(timeout=10) == 0
        assert wait_for(marker).strip() == "cold"
        assert p.stderr is not None and b"no restore within 0.2s" in p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
