"""Finding a container's processes on the host from its container ID.

Every runtime puts the container ID in the cgroup path of its processes (containerd:
`.../cri-containerd-<id>.scope` or `.../<id>`, CRI-O: `crio-<id>.scope`, Docker: `docker/<id>`), so a scan
of `/proc/*/cgroup` finds them without talking to the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MIN_ID_LEN = 12


class ContainerNotRunning(LookupError):
    """No host process belongs to the container (it is not running here, or it just exited)."""


def strip_runtime(container_id: str) -> str:
    """`containerd://abc…` -> `abc…`."""
    return container_id.split("://", 1)[-1].strip()


@dataclass(frozen=True)
class ContainerProcs:
    pids: tuple[int, ...]
    root: int


def _ppid(status: str) -> int:
    for line in status.splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    return 0


def find_processes(container_id: str, proc_root: Path = Path("/proc")) -> ContainerProcs:
    cid = strip_runtime(container_id)
    if len(cid) < MIN_ID_LEN:
        raise ValueError(f"container id {container_id!r} is too short to match cgroups safely")
    parents: dict[int, int] = {}
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if cid not in (entry / "cgroup").read_text():
                continue
            parents[int(entry.name)] = _ppid((entry / "status").read_text())
        except OSError:  # the process exited while we looked
            continue
    if not parents:
        raise ContainerNotRunning(f"no process of container {cid[:12]} under {proc_root}")
    roots = sorted(pid for pid, ppid in parents.items() if ppid not in parents)
    return ContainerProcs(pids=tuple(sorted(parents)), root=roots[0])


def environ_of(pid: int, proc_root: Path = Path("/proc")) -> dict[str, str]:
    """The environment a process started with (what the kubelet gave the container)."""
    raw = (proc_root / str(pid) / "environ").read_bytes()
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        if b"=" in item:
            key, _, value = item.decode(errors="replace").partition("=")
            env[key] = value
    return env


def ns_pid(pid: int, proc_root: Path = Path("/proc")) -> int:
    """`pid` (a host PID) as its own, innermost PID namespace sees it: what the pod's processes see."""
    for line in (proc_root / str(pid) / "status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    return pid


def _nspid_is_one(pid: int, proc_root: Path) -> bool:
    try:
        for line in (proc_root / str(pid) / "status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return line.split()[-1] == "1"
    except OSError:
        pass
    return False


def restored_in(container_id: str, proc_root: Path = Path("/proc")) -> list[int]:
    """Processes in the container's cgroup that its own process did not start: a tree CRIU restored (it
    joins the container's cgroups and is re-parented to the pod's PID 1, pause), with its descendants.
    The container's own process (the placeholder, whose parent is the runtime's shim) and its children
    are not among them. Parents before children."""
    cid = strip_runtime(container_id)
    parents: dict[int, int] = {}
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if cid in (entry / "cgroup").read_text():
                parents[int(entry.name)] = _ppid((entry / "status").read_text())
        except OSError:
            continue
    roots = [pid for pid, ppid in parents.items() if ppid not in parents and _nspid_is_one(ppid, proc_root)]
    found: list[int] = []
    todo = sorted(roots)
    while todo:
        pid = todo.pop(0)
        found.append(pid)
        todo.extend(sorted(p for p, pp in parents.items() if pp == pid))
    return found


def kill_restored(container_id: str, proc_root: Path = Path("/proc")) -> list[int]:
    """SIGKILL what a restore left in the container (see `restored_in`); returns the host PIDs killed."""
    from podsnap import engine

    pids = restored_in(container_id, proc_root)
    if pids:
        engine.kill_tree(pids)
    return pids
