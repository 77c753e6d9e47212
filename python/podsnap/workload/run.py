"""`podsnap-run [--standby-timeout S] -- CMD [ARG...]`: the worker container's standby-aware entrypoint.

Normal mode: run CMD as a child, forward signals to it, reap every zombie (as PID 1 of a container,
orphans land here), and exit with the child's status (128+N when a signal N killed it). The worker
is then never PID 1 of its container, which a restore needs: the restored worker comes back with its
old namespace PID, so that PID must be free in the new pod.

Standby mode (`SNAPSHOT_RESTORE_STANDBY=1`): run nothing and wait, inert, for the node agent to
restore the captured worker into this container; the restored worker becomes our child. Signals go
to whatever children we have, zombies are reaped, and we exit with the restored worker's status once
it is gone (128+N when a signal N ends the standby with no child). `--standby-timeout S` gives up
waiting after S seconds with no child and runs CMD cold instead, so a lost restore still serves.
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

from podsnap.contract import ENV_RESTORE_STANDBY, is_truthy

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


def _spawn(cmd: Sequence[str]) -> int:
    path = shutil.which(cmd[0]) or cmd[0]
    try:
        # the child starts with no signal blocked and default dispositions (Python ignores SIGPIPE)
        return os.posix_spawn(path, list(cmd), dict(os.environ), setsigmask=(), setsigdef=(signal.SIGPIPE,))
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
        if (
            standby
            and main_pid is None
            and last_status is None
            and standby_timeout_s is not None
            and time.monotonic() - standby_since >= standby_timeout_s
            and not _children()
        ):
            if not cmd:
                return 0
            print(f"podsnap-run: no restore within {standby_timeout_s:g}s; cold-starting {cmd[0]}", file=sys.stderr)
            standby = False
            main_pid = _spawn(cmd)


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
    return supervise(cmd, standby=standby, standby_timeout_s=args.standby_timeout)


if __name__ == "__main__":
    raise SystemExit(main())
