"""Finding a container's processes on the host from its container ID and its pod's UID.

Every runtime puts the container ID in the cgroup path of its processes, right below the pod's own
cgroup, which carries the pod's UID: cgroupfs `/kubepods/<qos>/pod<uid>/<id>` (CRI-O: `crio-<id>`), systemd
`/kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid with _ for ->.slice/cri-containerd-<id>.scope`
(`docker-<id>.scope`, `crio-<id>.scope`). So a scan of `/proc/*/cgroup` finds them without talking to the
runtime.

The container ID comes from the pod's status, which a namespace user may write (docs/security.md, the
finding on the container named by the pod's status): it is accepted only whole (`<runtime>://` and 64
lowercase hex digits) and must be the whole container component of a cgroup path right below the pod's
own cgroup, named by the pod's UID (its metadata, which no user writes). A status naming a substring, a
prefix or another pod's container finds nothing here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: what the kubelet reports as containerStatuses[].containerID for containerd, CRI-O and Docker
_CONTAINER_ID = re.compile(r"(?P<runtime>[a-z][a-z0-9.+-]*)://(?P<id>[0-9a-f]{64})")
#: metadata.uid: a UUID the API server assigned
_POD_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
#: the container component of a cgroup path, per runtime and cgroup driver, around the 64-hex ID
_CONTAINER_FORMS = ("{}", "crio-{}", "cri-containerd-{}.scope", "docker-{}.scope", "crio-{}.scope")


class ContainerNotRunning(LookupError):
    """No host process belongs to the container (it is not running here, or it just exited)."""


class ContainerRefused(ValueError):
    """The pod status names a container the agent will not act on for this pod: a malformed or partial
    container ID, or one whose processes lie under another pod's cgroup."""


@dataclass(frozen=True)
class ContainerRef:
    """A container of one pod: its 64-hex ID and the UID of the pod it must belong to."""

    container_id: str
    pod_uid: str

    @classmethod
    def of(cls, container_id: str, pod_uid: str) -> ContainerRef:
        """`containerd://<64 hex>` of the pod `pod_uid`, or ContainerRefused naming what is wrong."""
        found = _CONTAINER_ID.fullmatch(container_id.strip())
        if found is None:
            raise ContainerRefused(
                f"containerID {container_id[:100]!r} is not a whole container ID (<runtime>://<64 lowercase hex>, "
                "as the kubelet reports it): the agent acts on no container it names"
            )
        if not _POD_UID.fullmatch(pod_uid):
            raise ContainerRefused(f"pod uid {pod_uid[:60]!r} is not a UID the API server assigns")
        return cls(found["id"], pod_uid)

    def _container_component(self, part: str) -> bool:
        return any(part == form.format(self.container_id) for form in _CONTAINER_FORMS)

    def _pod_component(self, part: str) -> bool:
        # cgroupfs `pod<uid>`; systemd `kubepods[-<qos>]-pod<uid_>.slice`
        underscored = self.pod_uid.replace("-", "_")
        return part == f"pod{self.pod_uid}" or (
            part.startswith("kubepods") and part.endswith(f"-pod{underscored}.slice")
        )

    def placement(self, cgroup: str) -> bool | None:
        """Where `/proc/<pid>/cgroup` puts the process: True in this container of this pod, False in a
        container of that ID under another pod's cgroup (or none), None not in a container of that ID."""
        verdict: bool | None = None
        for parts in _paths(cgroup):
            for i, part in enumerate(parts):
                if not self._container_component(part):
                    continue
                # the pod's cgroup is the container's parent; deeper components are the container's own
                # sub-cgroups, which only the container (or the host's root) can create
                if i > 0 and self._pod_component(parts[i - 1]):
                    return True
                verdict = False
        return verdict


def _paths(cgroup: str) -> Iterator[list[str]]:
    """The path of each hierarchy line (`id:controllers:path`), split into its components."""
    for line in cgroup.splitlines():
        path = line.split(":", 2)[-1]
        yield [p for p in path.split("/") if p]


@dataclass(frozen=True)
class ContainerProcs:
    pids: tuple[int, ...]
    root: int
    #: `root`'s start time (/proc/PID/stat field 22), read before its cgroup showed it in the container: the
    #: engine refuses the PID if it then names another process (it exited and the PID was reused)
    root_start: int | None = None


def _ppid(status: str) -> int:
    for line in status.splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    return 0


def _members(ref: ContainerRef, proc_root: Path) -> dict[int, tuple[int, int | None]]:
    """pid -> (ppid, start time) of the container's processes; ContainerRefused when the ID names only
    processes under another pod's cgroup (a status pointing at a container that is not this pod's).

    The start time is read before the cgroup: if the PID changed hands in between, the start time is the
    earlier process's and the engine refuses the PID later; it can never vouch for a process outside."""
    from podsnap.engine import process_start_time

    parents: dict[int, tuple[int, int | None]] = {}
    elsewhere = False
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            start = process_start_time(int(entry.name), proc_root)
            where = ref.placement((entry / "cgroup").read_text())
            if where:
                parents[int(entry.name)] = (_ppid((entry / "status").read_text()), start)
            elif where is False:
                elsewhere = True
        except OSError:  # the process exited while we looked
            continue
    if not parents and elsewhere:
        raise ContainerRefused(
            f"container {ref.container_id[:12]} does not belong to pod uid {ref.pod_uid}: its processes lie under "
            "another pod's cgroup (the pod's status names a container that is not its own)"
        )
    return parents


def find_processes(ref: ContainerRef, proc_root: Path = Path("/proc")) -> ContainerProcs:
    parents = _members(ref, proc_root)
    if not parents:
        raise ContainerNotRunning(f"no process of container {ref.container_id[:12]} under {proc_root}")
    roots = sorted(pid for pid, (ppid, _) in parents.items() if ppid not in parents)
    return ContainerProcs(pids=tuple(sorted(parents)), root=roots[0], root_start=parents[roots[0]][1])


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


def restored_in(ref: ContainerRef, proc_root: Path = Path("/proc")) -> list[int]:
    """Processes in the container's cgroup that its own process did not start: a tree CRIU restored (it
    joins the container's cgroups and is re-parented to the pod's PID 1, pause), with its descendants.
    The container's own process (the placeholder, whose parent is the runtime's shim) and its children
    are not among them. Parents before children."""
    parents = {pid: ppid for pid, (ppid, _) in _members(ref, proc_root).items()}
    roots = [pid for pid, ppid in parents.items() if ppid not in parents and _nspid_is_one(ppid, proc_root)]
    found: list[int] = []
    todo = sorted(roots)
    while todo:
        pid = todo.pop(0)
        found.append(pid)
        todo.extend(sorted(p for p, pp in parents.items() if pp == pid))
    return found


def kill_restored(ref: ContainerRef, proc_root: Path = Path("/proc")) -> list[int]:
    """SIGKILL what a restore left in the container (see `restored_in`); returns the host PIDs killed."""
    from podsnap import engine

    pids = restored_in(ref, proc_root)
    if pids:
        engine.kill_tree(pids)
    return pids
