"""Which processes the agent takes for a pod's container (docs/security.md, the finding on the container named by the pod's status): the container ID from the
pod's status counts only whole, and only as the container component right below the pod's own cgroup,
named by the pod's UID. A /proc laid out in a temp dir for the layouts of both cgroup drivers and the
runtimes; the last test uses real cgroups and real processes."""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from pathlib import Path

import pytest
from tests.support.harness import cgroups_writable, pod_cgroup

from podsnap.agent.containers import (
    ContainerNotRunning,
    ContainerRef,
    ContainerRefused,
    environ_of,
    find_processes,
    restored_in,
)
from podsnap.engine import process_start_time

UID = "3f2c8a9e-1b4d-4e6f-9a7b-0c1d2e3f4a5b"
OTHER_UID = "9d8c7b6a-5f4e-4d3c-8b2a-1f0e9d8c7b6a"
CID = "0" + "a1b2c3d4" * 7 + "e5f6a7b"
VICTIM = "0" + "f" * 63


def fake_proc(
    root: Path, pid: int, ppid: int, *cgroups: str, environ: bytes = b"", nspid: int | None = None, start: int = 0
) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    if start:  # /proc/PID/stat: field 22 is the start time; a comm with ") " in it must not shift it
        (d / "stat").write_text(f"{pid} (a) b) S {ppid} " + " ".join(["0"] * 17) + f" {start} 0 0\n")
    (d / "cgroup").write_text("".join(f"{i}:{'pids' if i else ''}:{cg}\n" for i, cg in enumerate(cgroups)))
    ns = f"NSpid:\t{pid}\t{nspid}\n" if nspid is not None else f"NSpid:\t{pid}\n"
    (d / "status").write_text(f"Name:\tx\nPPid:\t{ppid}\n{ns}")
    (d / "environ").write_bytes(environ)


def cgroupfs(uid: str, cid: str, qos: str = "besteffort/") -> str:
    return f"/kubepods/{qos}pod{uid}/{cid}"


def systemd(uid: str, cid: str, scope: str = "cri-containerd-{}.scope") -> str:
    u = uid.replace("-", "_")
    return f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/{scope.format(cid)}"


@pytest.mark.parametrize(
    "path",
    [
        cgroupfs(UID, CID),
        cgroupfs(UID, CID, qos=""),  # Guaranteed: no QoS level
        cgroupfs(UID, f"crio-{CID}"),
        systemd(UID, CID),
        systemd(UID, CID, "docker-{}.scope"),
        systemd(UID, CID, "crio-{}.scope"),
        f"/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope",
        # a private cgroup namespace shows the path relative to the reader's own cgroup
        f"/../../kubepods-besteffort-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope",
        cgroupfs(UID, CID) + "/worker",  # a sub-cgroup the container made of its own
    ],
)
def test_both_drivers_layouts_are_found(tmp_path: Path, path: str) -> None:
    fake_proc(tmp_path, 10, 1, path, environ=b"A=1\0POD_NAME=x\0")
    fake_proc(tmp_path, 11, 10, path)
    procs = find_processes(ContainerRef.of(f"containerd://{CID}", UID), tmp_path)
    assert procs.pids == (10, 11) and procs.root == 10
    assert environ_of(10, tmp_path) == {"A": "1", "POD_NAME": "x"}


def test_the_root_is_pinned_by_its_start_time_read_before_its_cgroup(tmp_path: Path) -> None:
    fake_proc(tmp_path, 10, 1, cgroupfs(UID, CID), start=4242)
    fake_proc(tmp_path, 11, 10, cgroupfs(UID, CID), start=4243)
    procs = find_processes(ContainerRef.of(f"containerd://{CID}", UID), tmp_path)
    assert (procs.root, procs.root_start) == (10, 4242)
    gone = tmp_path / "other"
    fake_proc(gone, 10, 1, cgroupfs(UID, CID))  # no stat: the process went between the two reads
    assert find_processes(ContainerRef.of(f"containerd://{CID}", UID), gone).root_start is None


def test_a_cgroup_v1_process_is_found_by_any_of_its_hierarchies(tmp_path: Path) -> None:
    fake_proc(tmp_path, 10, 1, "/user.slice", cgroupfs(UID, CID))
    assert find_processes(ContainerRef.of(f"docker://{CID}", UID), tmp_path).pids == (10,)


@pytest.mark.parametrize(
    "container_id",
    [
        "containerd://containerd-0",  # the review's spoof: every ID starting with 0 matched
        "containerd://kubepods-burstable",  # matched every burstable pod's processes
        "containerd://0",
        f"containerd://{CID[:12]}",  # a prefix, however long
        f"containerd://{CID[:63]}",
        f"containerd://{CID}0",
        f"containerd://{CID.upper()}",
        CID,  # no runtime
        f"containerd://{CID}/../x",
        f"containerd://cri-containerd-{CID}.scope",
        "",
    ],
)
def test_a_partial_or_malformed_id_is_refused_naming_the_field(tmp_path: Path, container_id: str) -> None:
    fake_proc(tmp_path, 10, 1, cgroupfs(UID, CID))
    with pytest.raises(ContainerRefused, match=r"not a whole container ID \(<runtime>://<64 lowercase hex>"):
        ContainerRef.of(container_id, UID)


def test_a_substring_of_the_path_is_not_a_container(tmp_path: Path) -> None:
    """The ID must be the whole container component: a container whose ID merely contains it, or a pod
    component that contains it, is another container."""
    fake_proc(tmp_path, 10, 1, cgroupfs(UID, f"x{CID}"))
    fake_proc(tmp_path, 11, 1, f"/kubepods/pod{UID}/{CID}x")
    fake_proc(tmp_path, 12, 1, f"/kubepods/pod{UID}/cri-containerd-{CID}")
    with pytest.raises(ContainerNotRunning):
        find_processes(ContainerRef.of(f"containerd://{CID}", UID), tmp_path)


@pytest.mark.parametrize("layout", [cgroupfs, systemd])
def test_another_pods_container_is_refused(tmp_path: Path, layout: object) -> None:
    """A status that names a real, whole container ID of another pod: refused, its processes untouched."""
    assert callable(layout)
    fake_proc(tmp_path, 20, 1, layout(OTHER_UID, VICTIM))
    fake_proc(tmp_path, 21, 5, layout(OTHER_UID, VICTIM), nspid=2)
    fake_proc(tmp_path, 5, 0, layout(OTHER_UID, "b" * 64), nspid=1)  # the other pod's pause
    ref = ContainerRef.of(f"containerd://{VICTIM}", UID)
    with pytest.raises(ContainerRefused, match=f"does not belong to pod uid {UID}"):
        find_processes(ref, tmp_path)
    with pytest.raises(ContainerRefused):
        restored_in(ref, tmp_path)
    # a pod component that merely starts like the pod's is another pod
    fake_proc(tmp_path, 30, 1, f"/kubepods/pod{UID}0/{CID}")
    with pytest.raises(ContainerRefused):
        find_processes(ContainerRef.of(f"containerd://{CID}", UID), tmp_path)


def test_the_container_must_sit_right_below_its_pod(tmp_path: Path) -> None:
    fake_proc(tmp_path, 10, 1, f"/kubepods/pod{UID}/elsewhere/{CID}")
    fake_proc(tmp_path, 11, 1, f"/kubepods/{CID}/pod{UID}")
    with pytest.raises(ContainerRefused):
        find_processes(ContainerRef.of(f"containerd://{CID}", UID), tmp_path)


def test_a_pod_uid_that_is_no_uid_is_refused() -> None:
    with pytest.raises(ContainerRefused, match="pod uid"):
        ContainerRef.of(f"containerd://{CID}", "")
    with pytest.raises(ContainerRefused, match="pod uid"):
        ContainerRef.of(f"containerd://{CID}", "besteffort")


def test_what_was_restored_is_found_in_its_own_pod_only(tmp_path: Path) -> None:
    """The review's kill: the processes of a container whose ID starts like the spoofed one, re-parented
    to their pod's PID 1, are not what was restored into this pod."""
    fake_proc(tmp_path, 5, 0, cgroupfs(UID, "c" * 64), nspid=1)  # this pod's pause
    fake_proc(tmp_path, 10, 2, cgroupfs(UID, CID))  # the placeholder, a child of the runtime's shim
    fake_proc(tmp_path, 11, 5, cgroupfs(UID, CID), nspid=2)  # restored, re-parented to pause
    fake_proc(tmp_path, 12, 11, cgroupfs(UID, CID), nspid=3)
    fake_proc(tmp_path, 6, 0, cgroupfs(OTHER_UID, "d" * 64), nspid=1)  # another pod's pause
    fake_proc(tmp_path, 20, 6, cgroupfs(OTHER_UID, VICTIM), nspid=2)  # its worker: ID starts like CID
    assert restored_in(ContainerRef.of(f"containerd://{CID}", UID), tmp_path) == [11, 12]


@pytest.mark.parametrize("systemd_driver", [False, True])
def test_real_processes_in_real_cgroups_of_both_layouts(systemd_driver: bool) -> None:
    """The same with the kernel's /proc: a process in this pod's container cgroup is found; one in another
    pod's container, whose ID shares all but its last digit, is refused."""
    if cgroups_writable() is not None:
        pytest.skip(str(cgroups_writable()))
    uid, other = str(uuid.uuid4()), str(uuid.uuid4())
    mine, theirs = CID[:-1] + "1", CID[:-1] + "2"
    placed: list[tuple[subprocess.Popen[bytes], Path]] = []
    try:
        for pod, cid in ((uid, mine), (other, theirs)):
            proc = subprocess.Popen(["sleep", "60"])
            cgroup = pod_cgroup(pod, cid, systemd=systemd_driver)
            cgroup.mkdir(parents=True)
            placed.append((proc, cgroup))
            (cgroup / "cgroup.procs").write_text(str(proc.pid))
        found = find_processes(ContainerRef.of(f"containerd://{mine}", uid))
        assert found.pids == (placed[0][0].pid,)
        assert found.root_start is not None and found.root_start == process_start_time(placed[0][0].pid)
        with pytest.raises(ContainerRefused):
            find_processes(ContainerRef.of(f"containerd://{theirs}", uid))
    finally:
        for proc, cgroup in placed:
            proc.kill()
            proc.wait()
            with contextlib.suppress(OSError):
                cgroup.rmdir()
                cgroup.parent.rmdir()
