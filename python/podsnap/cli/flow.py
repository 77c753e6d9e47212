"""The single-host contract flow around `podsnap capture` and `podsnap restore` (`--control-dir`).

capture: wait, with progress on stderr, until the worker wrote `ready-for-snapshot` (it has warmed up
and quiesced), failing early if it exits; then the engine captures it.
restore: after the engine restored the worker, write `restore-context.json` (the `--context`
entries) and then `restore-complete`, so the worker (waiting since before its capture) resumes. If
that write fails, the restored worker is killed: it would wait for ever, never serving.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from podsnap.contract import FILE_READY_FOR_SNAPSHOT, FILE_RESTORE_COMPLETE
from podsnap.controldir import ControlDir, ControlDirError, ControlDirTimeout


class ReadyWaitError(RuntimeError):
    pass


class ContextError(ValueError):
    pass


def wait_ready(
    control_dir: str | Path,
    pid: int,
    timeout_s: float,
    *,
    stream: TextIO | None = None,
    every_s: float = 5.0,
) -> float:
    """Wait for `ready-for-snapshot`; seconds waited. ReadyWaitError on timeout, if `pid` exits, or a bad dir."""
    out = stream or sys.stderr
    ctl = ControlDir(control_dir)
    if not Path(control_dir).is_dir():
        raise ReadyWaitError(f"--control-dir {control_dir}: not a directory; pass the worker's SNAPSHOT_CONTROL_DIR")
    last = [0.0]

    def poll(waited: float) -> None:
        if not Path(f"/proc/{pid}").exists():
            raise ReadyWaitError(f"pid {pid} exited before it wrote {FILE_READY_FOR_SNAPSHOT}; nothing to capture")
        if waited - last[0] >= every_s:
            last[0] = waited
            print(
                f"waiting for {ctl}/{FILE_READY_FOR_SNAPSHOT} ({waited:.0f} s of {timeout_s:g} s)", file=out, flush=True
            )

    if not ctl.exists(FILE_READY_FOR_SNAPSHOT):
        print(f"waiting for pid {pid} to write {ctl}/{FILE_READY_FOR_SNAPSHOT}", file=out, flush=True)
    try:
        waited = ctl.wait_for(FILE_READY_FOR_SNAPSHOT, timeout_s=timeout_s, poll_s=0.05, on_poll=poll)
    except ControlDirTimeout as e:
        raise ReadyWaitError(
            f"{e}; is {control_dir} the worker's SNAPSHOT_CONTROL_DIR, and has it finished warming up? "
            "(--ready-timeout to wait longer)"
        ) from e
    except ControlDirError as e:
        raise ReadyWaitError(str(e)) from e
    return waited


def parse_context(entries: Sequence[str], control_dir: str | None) -> dict[str, str]:
    """`KEY=VALUE` entries as a dict; ContextError names the bad entry and the fix."""
    if entries and control_dir is None:
        raise ContextError("--context needs --control-dir: the context is written into the worker's control dir")
    env: dict[str, str] = {}
    for entry in entries:
        key, sep, value = entry.partition("=")
        if not sep or not key or not key.replace("_", "a").isalnum() or key[0].isdigit():
            raise ContextError(f"--context {entry!r}: expected KEY=VALUE with KEY an environment variable name")
        env[key] = value
    return env


def signal_restored(control_dir: str, context: dict[str, str], pid: int, *, in_namespace: bool) -> None:
    """Write the context and `restore-complete`; on failure kill the restored `pid` (it would never serve).

    With `in_namespace`, `control_dir` is a path inside the restored process's root, reached safely
    (no symlinks) through /proc/PID/root, as the node agent does.
    """
    ctl = ControlDir.in_root(f"/proc/{pid}/root", control_dir) if in_namespace else ControlDir(control_dir)
    try:
        ctl.signal_restored(context)
    except OSError as e:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        raise type(e)(
            f"{e}; the restored worker (pid {pid}) could not be told to resume ({FILE_RESTORE_COMPLETE}) and was killed"
        ) from e
