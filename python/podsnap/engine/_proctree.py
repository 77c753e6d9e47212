"""Everything the engine reads from /proc: process trees, PID namespaces, cgroups, memory, I/O, stdio.

Host PIDs unless said otherwise.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    #: the PID as the innermost PID namespace sees it (equal to pid outside containers)
    ns_pid: int
    ppid: int
    comm: str
    cmdline: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "nsPid": self.ns_pid,
            "ppid": self.ppid,
            "comm": self.comm,
            "cmdline": list(self.cmdline),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProcInfo:
        return cls(
            pid=int(data["pid"]),
            ns_pid=int(data.get("nsPid", data["pid"])),
            ppid=int(data.get("ppid", 0)),
            comm=str(data.get("comm", "")),
            cmdline=tuple(str(a) for a in data.get("cmdline") or ()),
        )


def _status(pid: int) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (PROC / str(pid) / "status").read_text().splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def is_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        return _status(pid).get("State", "").split()[:1] != ["Z"]
    except (FileNotFoundError, ProcessLookupError):
        return False


def exists(pid: int) -> bool:
    """True while `pid` is taken, zombies included (a zombie still blocks its PID for a restore)."""
    return (PROC / str(pid)).exists()


def proc_info(pid: int) -> ProcInfo:
    st = _status(pid)
    nspids = st.get("NSpid", str(pid)).split()
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        raw = b""
    return ProcInfo(
        pid=pid,
        ns_pid=int(nspids[-1]) if nspids else pid,
        ppid=int(st.get("PPid", "0")),
        comm=st.get("Name", ""),
        cmdline=tuple(a.decode(errors="replace") for a in raw.split(b"\0") if a),
    )


def state(pid: int) -> str:
    """The one-letter state of `pid` (R, S, D, T, t, Z, ...); "" when it is gone."""
    try:
        return _status(pid).get("State", "")[:1]
    except (FileNotFoundError, ProcessLookupError):
        return ""


def rss_bytes(pids: list[int]) -> int:
    """Resident memory of `pids` together (VmRSS): what a dump will write, roughly."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError):
            for line in (PROC / str(pid) / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total


def bytes_read(pid: int) -> int:
    """Bytes `pid` and its descendants have read so far (/proc/PID/io rchar): CRIU's restore progress."""
    total = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError, ValueError):
            for line in (PROC / str(p) / "io").read_text().splitlines():
                if line.startswith("rchar:"):
                    total += int(line.split()[1])
            for task in (PROC / str(p) / "task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
    return total


def cgroups_as_host_sees(pid: int, host_pid: int = 1) -> str:
    """`/proc/PID/cgroup` as read from the host's cgroup namespace (that of `host_pid`, the host's init).

    The kernel prints those paths relative to the reader's cgroup namespace, so a reader in a container
    with a namespace of its own (the agent on cgroup v2) sees `/../..`-relative paths that the host's
    cgroup filesystem does not have; read through the host's namespace they are absolute. Where that
    namespace cannot be inspected (no ptrace access to `host_pid`), it is read as is."""
    try:
        ours, hosts = ((PROC / p / "ns" / "cgroup").stat().st_ino for p in ("self", str(host_pid)))
    except PermissionError:
        ours = hosts = 0
    if ours == hosts:
        return (PROC / str(pid) / "cgroup").read_text()
    got = subprocess.run(
        ["nsenter", f"--cgroup={PROC}/{host_pid}/ns/cgroup", "--", "cat", f"{PROC}/{pid}/cgroup"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if got.returncode != 0:
        raise OSError(f"reading the cgroups of pid {pid} in the host's cgroup namespace: {got.stderr.strip()}")
    return got.stdout


def cgroup_procs_files(pid: int, cgroup_root: Path = Path("/sys/fs/cgroup")) -> list[str]:
    """The `cgroup.procs` file, under `cgroup_root` (the host's cgroup filesystem as mounted here), of every
    cgroup `pid` is in (v1 hierarchies and v2). FileNotFoundError names a cgroup that is not there: a
    `cgroup_root` that is not the host's whole hierarchy (a container's own /sys/fs/cgroup shows only itself)."""
    targets: list[str] = []
    for line in cgroups_as_host_sees(pid).splitlines():
        _, ctrl, path = line.split(":", 2)
        if ctrl == "":
            roots = [cgroup_root / "unified", cgroup_root]
        elif ctrl.startswith("name="):
            roots = [cgroup_root / ctrl[5:]]
        else:
            roots = [cgroup_root / ctrl, *(cgroup_root / c for c in ctrl.split(","))]
        if not any(root.is_dir() for root in roots):
            continue  # a hierarchy not mounted here at all (e.g. a named one no runtime uses): nothing to join
        found = next(
            (f"{root}{path}/cgroup.procs" for root in roots if Path(f"{root}{path}/cgroup.procs").exists()), None
        )
        if found is None:
            raise FileNotFoundError(
                f"cgroup {ctrl or 'v2'}:{path} of pid {pid} is not under {cgroup_root}: "
                "it must be the host's cgroup filesystem"
            )
        targets.append(found)
    return targets


def all_pids() -> list[int]:
    return sorted(int(p.name) for p in PROC.iterdir() if p.name.isdigit())


def tree(root: int) -> list[ProcInfo]:
    """`root` and all its descendants, parents before children (root first)."""
    infos: dict[int, ProcInfo] = {}
    for pid in all_pids():
        with contextlib.suppress(OSError, ValueError):
            infos[pid] = proc_info(pid)
    if root not in infos:
        raise ProcessLookupError(f"no process with pid {root}")
    children: dict[int, list[int]] = {}
    for info in infos.values():
        children.setdefault(info.ppid, []).append(info.pid)
    out: list[ProcInfo] = []
    todo = [root]
    while todo:
        pid = todo.pop(0)
        out.append(infos[pid])
        todo.extend(sorted(children.get(pid, [])))
    return out


def pid_ns(pid: int) -> str:
    """The PID namespace identity of `pid` (e.g. 'pid:[4026531836]')."""
    return str((PROC / str(pid) / "ns" / "pid").readlink())


def host_pid_in_ns(ns_pid: int, ns_of: int) -> int | None:
    """Host PID of the process that is `ns_pid` inside the PID namespace of host process `ns_of`."""
    target = pid_ns(ns_of)
    for pid in all_pids():
        try:
            if pid_ns(pid) != target:
                continue
            nspids = _status(pid).get("NSpid", "").split()
        except OSError:
            continue
        if nspids and int(nspids[-1]) == ns_pid:
            return pid
    return None


def io_uring_users(pids: list[int], proc: Path = PROC) -> list[int]:
    """Those of `pids` holding an io_uring instance (CRIU cannot checkpoint io_uring)."""
    out = []
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in (proc / str(pid) / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if "io_uring" in str(fd.readlink()):
                        out.append(pid)
                        break
    return out


def kill_tree(pids: list[int], *, timeout_s: float = 5.0) -> None:
    """SIGKILL every listed process (children first) and wait until none is alive."""
    for pid in reversed(pids):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(is_alive(p) for p in pids):
        time.sleep(0.02)


def wait_stopped(pids: list[int], *, timeout_s: float = 10.0) -> list[int]:
    """Wait until every one of `pids` is stopped (state T); return those that are not, at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        running = [p for p in pids if state(p) != "T"]
        if not running or time.monotonic() > deadline:
            return running
        time.sleep(0.005)


def resume(pids: list[int], *, timeout_s: float = 10.0) -> list[int]:
    """SIGCONT each of `pids` (a tree left stopped by `criu restore --leave-stopped`) and wait until none
    is stopped any more (the CUDA restore that follows needs its process running); return those still
    stopped at the deadline."""
    for pid in pids:
        os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + timeout_s
    while True:
        stopped = [p for p in pids if state(p) == "T"]
        if not stopped or time.monotonic() > deadline:
            return stopped
        time.sleep(0.001)


def wait_gone(pid: int, *, timeout_s: float = 10.0) -> bool:
    """Wait until `pid` has exited AND been reaped (its PID free again); reap it if it is our child."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
        if not exists(pid):
            return True
        time.sleep(0.01)
    return not exists(pid)


#: manifest `extra` key holding the captured root's stdio pipes ({"1": "pipe:[123]", ...})
STDIO_KEY = "stdio"


def stdio_pipes(pid: int) -> dict[str, str]:
    """fds 0-2 of `pid` that are pipes, as CRIU names them (`pipe:[inode]`)."""
    found: dict[str, str] = {}
    for fd in (0, 1, 2):
        with contextlib.suppress(OSError):
            link = str(Path(f"/proc/{pid}/fd/{fd}").readlink())
            if link.startswith("pipe:["):
                found[str(fd)] = link
    return found


def open_stdio_like(pid: int, stdio: dict[str, str]) -> dict[int, str]:
    """Open `pid`'s own fds 0-2 for each recorded pipe: {our fd: recorded pipe id}, for CRIU's inherit-fd.

    A fd of `pid` that is not a pipe (or gone) is skipped: CRIU then restores that pipe on its own.
    """
    opened: dict[int, str] = {}
    try:
        for fd_text, key in sorted(stdio.items()):
            fd = int(fd_text)
            path = f"/proc/{pid}/fd/{fd}"
            if not str(Path(path).readlink()).startswith("pipe:["):
                continue
            opened[os.open(path, (os.O_RDONLY if fd == 0 else os.O_WRONLY) | os.O_CLOEXEC)] = key
    except (OSError, ValueError):
        for ours in opened:
            os.close(ours)
        raise
    return opened
