"""Pod-like sandboxes for the round trip's namespace mode, as the agent meets them in Kubernetes.

A sandbox has its own PID, mount, UTS and IPC namespaces (the host's network, like a pod's shared
network namespace seen from one node), and a PID 1 that reaps orphans the way `pause` does. The worker
is launched inside one and re-parented to its PID 1; the engine captures it with `namespace_pid` set
to that PID 1 and restores it into a second sandbox. Needs root and util-linux (unshare, nsenter).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

#: the sandbox's PID 1: reap whatever is re-parented to it, until killed
_INIT = (
    "import os, sys, time\n"
    "print('sandbox ready', flush=True)\n"
    "while True:\n"
    "    try:\n"
    "        os.wait()\n"
    "    except ChildProcessError:\n"
    "        time.sleep(0.05)\n"
)


class SandboxError(RuntimeError):
    pass


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (entry / "stat").read_text()
                if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
                    out.append(int(entry.name))
    return out


def host_pid_of(ns_pid: int, init_pid: int) -> int | None:
    """The host PID of namespace PID `ns_pid` in the PID namespace of `init_pid`."""
    ns = Path(f"/proc/{init_pid}/ns/pid").readlink()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            if (entry / "ns" / "pid").readlink() != ns:
                continue
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("NSpid:") and int(line.split()[-1]) == ns_pid:
                    return int(entry.name)
    return None


class Sandbox:
    def __init__(self, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.dir = workdir
        pidfile, log = workdir / "unshare.pid", workdir / "sandbox.log"
        script = (
            f'echo $$ > "{pidfile}"; exec unshare --pid --mount --uts --ipc --fork --mount-proc '
            f'"{sys.executable}" -c "$0" </dev/null >"{log}" 2>&1'
        )
        subprocess.run(["setsid", "-f", "sh", "-c", script, _INIT], check=True)
        deadline = time.monotonic() + 20
        while "sandbox ready" not in (log.read_text() if log.exists() else ""):
            if time.monotonic() > deadline:
                raise SandboxError(f"the sandbox did not start: {log.read_text() if log.exists() else ''}")
            time.sleep(0.02)
        self.unshare_pid = int(pidfile.read_text())
        children = _children(self.unshare_pid)
        if len(children) != 1:
            raise SandboxError(f"expected one PID 1 under unshare {self.unshare_pid}, found {children}")
        self.init_pid = children[0]

    def launch(self, cmd: Sequence[str], env: dict[str, str], log: Path) -> int:
        """Start `cmd` inside, re-parented to the sandbox's PID 1; returns its host PID."""
        pidfile = self.dir / f"launch-{time.monotonic_ns()}.pid"
        script = f'echo $$ > "{pidfile}"; exec "$@" </dev/null >>"{log}" 2>&1'
        nsenter = ["nsenter", "-t", str(self.init_pid), "-m", "-u", "-i", "-p", "--"]
        subprocess.run([*nsenter, "setsid", "-f", "sh", "-c", script, "sh", *cmd], check=True, env=env)
        deadline = time.monotonic() + 30
        while True:
            text = pidfile.read_text().strip() if pidfile.exists() else ""
            host = host_pid_of(int(text), self.init_pid) if text else None
            if host is not None:
                return host
            if time.monotonic() > deadline:
                raise SandboxError(f"no process from the launcher in sandbox {self.init_pid} ({pidfile})")
            time.sleep(0.01)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.unshare_pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.init_pid, signal.SIGKILL)  # PID 1 dying takes the whole PID namespace with it
