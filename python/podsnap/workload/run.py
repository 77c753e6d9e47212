"""`podsnap-run [--standby-timeout S] -- CMD [ARG...]`: the worker container's standby-aware entrypoint.

Normal mode: run CMD as a child, forward signals to it, reap every zombie (as PID 1 of a container,
orphans land here), and exit with the child's status (128+N when a signal N killed it). The worker
is then never PID 1 of its container, which a restore needs: the restored worker comes back with its
old namespace PID, so that PID must be free in the new pod.

Standby mode (`SNAPSHOT_RESTORE_STANDBY=1`): run nothing and wait, inert, for the node agent to
restore the captured worker into this container; the restored worker becomes our child. Signals go
to whatever children we have, zombies are reaped, and we exit with the restored worker's status once
it is gone (128+N when a signal N ends the standby with no child). `--standby-timeout S` (default: the restore pod's
PODSNAP_RESTORE_TIMEOUT_S, when set) gives up waiting after S seconds with no child and runs CMD cold
instead, so a lost restore still serves; so does the agent's `podsnap-restore-failed` in the control dir
(at once). A restore the agent has begun (`podsnap-restoring`) is waited for past the timeout. A cold
start writes `podsnap-started-cold` (the restore pod's startup probe passes on it) and runs CMD without
the control-dir variables, so an SDK worker serves instead of waiting for a checkpoint nobody will take.
Under PODSNAP_RESTORE_FAILURE_POLICY=Fail a failed restore is not followed by a cold start.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from podsnap import contract as c
from podsnap.contract import ENV_RESTORE_STANDBY, is_truthy
from podsnap.controldir import ControlDir, ControlDirError, control_dir_from_env

FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGWINCH,
)
WAITED = {signal.SIGCHLD, *FORWARDED}


def _exit_status(wait_status: int) -> int:
    if os.WIFSIGNALED(wait_status):
        return 128 + os.WTERMSIG(wait_status)
    return os.waitstatus_to_exitcode(wait_status)


def _children() -> list[int]:
    """PIDs whose parent is this process (adopted ones included: a restored worker, orphans)."""
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2 :].split()[1]) == me:
            found.append(int(entry.name))
    return found


def _reap() -> list[tuple[int, int]]:
    """Collect every exited child; returns (pid, wait status) pairs."""
    reaped = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        reaped.append((pid, status))
    return reaped


#: what a cold start after standby takes away from CMD's environment (it must not wait for a checkpoint)
CONTROL_ENV = (c.ENV_CONTROL_DIR, c.ENV_CONTROL_DIR_DYNAMO, ENV_RESTORE_STANDBY)


def _control() -> ControlDir | None:
    try:
        path = control_dir_from_env()
    except ControlDirError:
        return None
    return None if path is None else ControlDir(path)


def _cold_reason(control: ControlDir | None, timed_out: bool, timeout_s: float | None) -> str | None:
    """Why standby must give up now and start CMD cold, or None to go on waiting. The agent's
    `podsnap-restore-failed` ends it at once; the timeout only while no restore is under way (each side
    writes its own file before it looks for the other's, so a cold start and a restore never both happen)."""
    fail = os.environ.get(c.ENV_RESTORE_FAILURE_POLICY) == c.RESTORE_FAILURE_FAIL
    if control is not None and not fail:
        raw = control.read_file(c.FILE_RESTORE_FAILED)
        if raw is not None:
            line = raw.decode(errors="replace").strip().splitlines()
            return f"the restore failed: {line[0] if line else 'no reason given'}"
    if not timed_out or fail:
        return None
    if control is not None:
        control.write_file(c.FILE_STARTED_COLD, b"1\n")
        if control.exists(c.FILE_RESTORING):
            control.remove(c.FILE_STARTED_COLD)
            return None
    return f"no restore within {timeout_s:g}s"


def _spawn(cmd: Sequence[str], *, cold: bool = False) -> int:
    path = shutil.which(cmd[0]) or cmd[0]
    environ = {k: v for k, v in os.environ.items() if not (cold and k in CONTROL_ENV)}
    try:
        # the child starts with no signal blocked and default dispositions (Python ignores SIGPIPE)
        return os.posix_spawn(path, list(cmd), environ, setsigmask=(), setsigdef=(signal.SIGPIPE,))
    except FileNotFoundError:
        print(f"podsnap-run: {cmd[0]}: command not found", file=sys.stderr)
        raise SystemExit(127) from None
    except PermissionError:
        print(f"podsnap-run: {cmd[0]}: permission denied", file=sys.stderr)
        raise SystemExit(126) from None


def supervise(cmd: Sequence[str] | None, *, standby: bool, standby_timeout_s: float | None = None) -> int:
    """Run the loop described in the module docstring; returns the exit status to use."""
    signal.pthread_sigmask(signal.SIG_BLOCK, WAITED)
    main_pid: int | None = None if standby else _spawn(cmd or ())
    standby_since = time.monotonic()
    last_status: int | None = None
    control = _control() if standby else None
    while True:
        timeout = 1.0
        if standby and main_pid is None and standby_timeout_s is not None:
            timeout = max(0.01, min(timeout, standby_since + standby_timeout_s - time.monotonic()))
        info = signal.sigtimedwait(WAITED, timeout)
        if info is not None and info.si_signo != signal.SIGCHLD:
            targets = [main_pid] if main_pid is not None and not standby else _children()
            if not targets:
                return 128 + info.si_signo
            for pid in targets:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, info.si_signo)
            continue
        for pid, status in _reap():
            if not standby and pid == main_pid:
                # take the child's status; orphans still around die with the container
                return _exit_status(status)
            if standby:
                last_status = _exit_status(status)
        if standby and last_status is not None and not _children():
            return last_status
        if standby and main_pid is None and last_status is None and not _children():
            timed_out = standby_timeout_s is not None and time.monotonic() - standby_since >= standby_timeout_s
            why = _cold_reason(control, timed_out, standby_timeout_s)
            if why is None:
                continue
            if not cmd:
                return 0
            if control is not None:
                control.write_file(c.FILE_STARTED_COLD, b"1\n")
            print(f"podsnap-run: {why}; cold-starting {cmd[0]}", file=sys.stderr)
            standby = False
            main_pid = _spawn(cmd, cold=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="podsnap-run",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog=f"Standby when {ENV_RESTORE_STANDBY}=1.",
    )
    parser.add_argument(
        "--standby-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="in standby, cold-start CMD if no worker was restored into this container within SECONDS",
    )
    parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD [ARG...]")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cmd: list[str] = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    standby = is_truthy(os.environ.get(ENV_RESTORE_STANDBY))
    if not cmd and not standby:
        print("podsnap-run: no command given; usage: podsnap-run -- CMD [ARG...]", file=sys.stderr)
        return 2
    if args.standby_timeout is not None and args.standby_timeout <= 0:
        print(f"podsnap-run: --standby-timeout must be > 0, got {args.standby_timeout:g}", file=sys.stderr)
        return 2
    timeout = args.standby_timeout
    if timeout is None and standby:
        try:
            timeout = float(os.environ.get(c.ENV_RESTORE_TIMEOUT) or 0) or None
        except ValueError:
            timeout = None
    return supervise(cmd, standby=standby, standby_timeout_s=timeout)


if __name__ == "__main__":
    raise SystemExit(main())
