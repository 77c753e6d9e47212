"""The namespaces CRIU enters are refused unless only the host controls them, and are the process the
caller meant (security review 2, findings 1 and 8).

The attack: a container's first process moves itself into a user and mount namespace of its own
(`unshare -Urm`, no fork, as an unprivileged user: the reviewer's `nobody`), mounts a tmpfs over /proc
and plants programs at /proc/self/fd/3..N. CRIU's binary used to be exec'd as `nsenter -t PID -m ...
-- /proc/self/fd/N`, resolved in that fake /proc: the planted program ran as host root. Each planted
program here records that it ran; none may.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from podsnap.engine import (
    CaptureError,
    CaptureOptions,
    Criu,
    CriuError,
    CriuOptions,
    RestoreError,
    RestoreOptions,
    capture,
    process_start_time,
    restore,
)
from podsnap.engine import _nsenter as nsenter
from podsnap.engine import _proctree as proctree
from tests.support.processes import Pod
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

#: planted at /proc/self/fd/3 .. /proc/self/fd/PLANTED - 1, more than the fds this test process holds
PLANTED = 400
NOBODY = 65534


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _plant_script(marker_dir: Path) -> str:
    """Shell: tmpfs over /proc, a program at each /proc/self/fd/N recording that it ran and as whom, a
    worker (sleep), and "ready" once all is in place."""
    program = f"#!/bin/sh\\nid > {marker_dir}/ran-as-$(id -u)-fd-%s\\n"
    return (
        "mount -t tmpfs fake /proc || exit 1; mkdir -p /proc/self/fd; "
        f"i=3; while [ $i -lt {PLANTED} ]; do printf '{program}' $i > /proc/self/fd/$i; "
        "chmod 755 /proc/self/fd/$i; i=$((i+1)); done; "
        "sleep 1000 & echo ready; wait"
    )


class FakeProcPod:
    """A pod (own PID, mount, UTS, IPC namespaces, like the other sandboxes here) whose PID 1 then puts a
    fake /proc in place: `tenant` as the reviewer's attack (an unprivileged user in a user and mount
    namespace of its own), else as root of the host's user namespace (a privileged container)."""

    def __init__(self, workdir: Path, marker_dir: Path, *, tenant: bool) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        log, pidfile = workdir / "pod.log", workdir / "unshare.pid"
        drop = f"setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups unshare -Urm " if tenant else ""
        cmd = (
            f"echo $$ > {pidfile}; exec unshare --pid --mount --uts --ipc --fork --mount-proc "
            f'{drop}sh -c "$0" </dev/null >{log} 2>&1'
        )
        subprocess.run(["setsid", "-f", "sh", "-c", cmd, _plant_script(marker_dir)], check=True)
        wait_for(
            lambda: "ready" in (log.read_text() if log.exists() else ""),
            what="the pod to plant its /proc",
            timeout=20,
            interval=0.02,
        )
        self.unshare_pid = int(pidfile.read_text())
        (self.init_pid,) = _children(self.unshare_pid)
        wait_for(lambda: len(_children(self.init_pid)) == 1, what="the worker", timeout=20, interval=0.02)
        (self.worker_pid,) = _children(self.init_pid)

    def stop(self) -> None:
        for pid in (self.unshare_pid, self.init_pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def markers(tmp_path: Path) -> Path:
    d = tmp_path / "markers"
    d.mkdir()
    return d


@pytest.fixture
def make_fake_proc_pod(tmp_path: Path, markers: Path) -> Iterator[Callable[[bool], FakeProcPod]]:
    pods: list[FakeProcPod] = []

    def make(tenant: bool) -> FakeProcPod:
        pods.append(FakeProcPod(tmp_path / f"fake-{len(pods)}", markers, tenant=tenant))
        return pods[-1]

    yield make
    for pod in pods:
        pod.stop()


@pytest.fixture
def pods(criu: Criu, tmp_path: Path) -> Iterator[tuple[Pod, Path]]:
    """An ordinary pod (CRIU and the artifact storage hidden inside), and the host-only storage."""
    host_only = tmp_path / "host-only"
    host_only.mkdir()
    pod = Pod(tmp_path / "pod", [host_only, criu.binary.exe.parent])
    try:
        yield pod, host_only
    finally:
        pod.stop()


def _tenant_userns_works() -> None:
    r = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "unshare", "-Urm", "true"],
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        pytest.skip(f"an unprivileged user cannot make a user namespace here: {r.stderr.strip()[:200]}")


def _worker_in(pod: Pod, tmp_path: Path) -> tuple[int, int]:
    """A worker in `pod`: (its host PID, the pod's PID 1 start time)."""
    _, ns_pid, _ = pod.start_worker(tmp_path / "worker")
    host_pid = proctree.host_pid_in_ns(ns_pid, pod.init_pid)
    assert host_pid is not None
    start = process_start_time(pod.init_pid)
    assert start is not None
    return host_pid, start


def test_a_tenant_with_its_own_user_and_mount_namespace_is_refused_at_capture_and_nothing_planted_runs(
    criu: Criu, make_fake_proc_pod: Callable[[bool], FakeProcPod], markers: Path, tmp_path: Path
) -> None:
    _tenant_userns_works()
    pod = make_fake_proc_pod(True)
    assert Path(f"/proc/{pod.init_pid}/ns/user").stat().st_ino != Path("/proc/self/ns/user").stat().st_ino
    with pytest.raises(CaptureError, match=f"pid {pod.init_pid} is in a user namespace of its own") as err:
        capture(pod.worker_pid, tmp_path / "snap", CaptureOptions(namespace_pid=pod.init_pid), criu=criu)
    assert err.value.phase == "inspect" and err.value.source_alive
    # CRIU itself, called directly, refuses it too: the check is made again right before it runs
    (tmp_path / "images").mkdir()
    with pytest.raises(CriuError, match="user namespace of its own"):
        criu.dump(2, tmp_path / "images", tmp_path / "work", CriuOptions(), namespace_pid=pod.init_pid)
    assert sorted(p.name for p in markers.iterdir()) == [], "a program planted in the fake /proc ran"
    assert proctree.is_alive(pod.worker_pid), "the worker was left alone"


def test_a_tenant_with_its_own_user_and_mount_namespace_is_refused_at_restore_and_nothing_planted_runs(
    criu: Criu,
    pods: tuple[Pod, Path],
    make_fake_proc_pod: Callable[[bool], FakeProcPod],
    markers: Path,
    tmp_path: Path,
) -> None:
    _tenant_userns_works()
    src, host_only = pods
    host_pid, _ = _worker_in(src, tmp_path)
    capture(host_pid, host_only / "snap", CaptureOptions(namespace_pid=src.init_pid), criu=criu)
    placeholder = make_fake_proc_pod(True)
    hooked: list[Path] = []
    opts = RestoreOptions(namespace_pid=placeholder.init_pid, before_restore=lambda art, _: hooked.append(art))
    with pytest.raises(RestoreError, match=f"pid {placeholder.init_pid} is in a user namespace of its own") as err:
        restore(host_only / "snap", opts, criu=criu)
    assert err.value.phase == "validate"
    assert hooked == [], "refused before anything ran"
    with pytest.raises(CriuError, match="user namespace of its own"):
        criu.restore(host_only / "snap" / "criu", tmp_path / "work", CriuOptions(), namespace_pid=placeholder.init_pid)
    assert sorted(p.name for p in markers.iterdir()) == [], "a program planted in the fake /proc ran"


def test_a_fake_proc_in_the_hosts_user_namespace_is_refused(
    criu: Criu, make_fake_proc_pod: Callable[[bool], FakeProcPod], markers: Path, tmp_path: Path
) -> None:
    """A container that may mount (CAP_SYS_ADMIN) is root on its node anyway; a /proc it faked before the
    capture is still refused, by its mounts."""
    pod = make_fake_proc_pod(False)
    with pytest.raises(CaptureError, match=f"mount namespace of pid {pod.init_pid} has /proc is a tmpfs mount"):
        capture(pod.worker_pid, tmp_path / "snap", CaptureOptions(namespace_pid=pod.init_pid), criu=criu)
    assert sorted(p.name for p in markers.iterdir()) == []


def test_a_namespace_pid_that_now_belongs_to_another_process_is_refused(
    criu: Criu, pods: tuple[Pod, Path], tmp_path: Path
) -> None:
    pod, host_only = pods
    host_pid, start = _worker_in(pod, tmp_path)
    other = start + 1  # what the PID's earlier owner started at
    with pytest.raises(CaptureError, match=f"pid {pod.init_pid} now belongs to another process") as err:
        capture(host_pid, host_only / "x", CaptureOptions(namespace_pid=pod.init_pid, namespace_start=other), criu=criu)
    assert err.value.source_alive and proctree.is_alive(host_pid)
    (tmp_path / "images").mkdir()
    with pytest.raises(CriuError, match="now belongs to another process"):
        criu.dump(
            2, tmp_path / "images", tmp_path / "work", CriuOptions(), namespace_pid=pod.init_pid, namespace_start=other
        )
    assert proctree.is_alive(host_pid)

    # the right start time passes; the artifact then restores only into the placeholder it names
    capture(host_pid, host_only / "snap", CaptureOptions(namespace_pid=pod.init_pid, namespace_start=start), criu=criu)
    wait_for(lambda: not proctree.exists(host_pid), what="the dumped worker to go", timeout=20, interval=0.02)
    with pytest.raises(RestoreError, match="now belongs to another process"):
        restore(host_only / "snap", RestoreOptions(namespace_pid=pod.init_pid, namespace_start=other), criu=criu)
    restored = restore(host_only / "snap", RestoreOptions(namespace_pid=pod.init_pid, namespace_start=start), criu=criu)
    assert proctree.proc_info(restored.pid).ppid == pod.init_pid


def test_criu_is_not_started_where_its_dirs_do_not_resolve_to_ours(
    make_fake_proc_pod: Callable[[bool], FakeProcPod], markers: Path, tmp_path: Path
) -> None:
    """The last check, made by the process about to become CRIU inside the container: should a fake /proc
    get past the checks before (mounted after them by a pod that may mount), it stops there."""
    pod = make_fake_proc_pod(False)
    fds = [os.open(f"/proc/{pod.init_pid}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC) for name in nsenter.NAMESPACES]
    exe = os.open("/bin/true", os.O_PATH | os.O_CLOEXEC)
    work = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    root = os.open(f"/proc/{pod.init_pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        child = nsenter.exec_in(
            nsenter.Target(pod.init_pid, tuple(fds), root), exe, ["true"], {}, keep_fds=[work], dirs=[work]
        )
        r = subprocess.run(
            ["/nonexistent/never-run"], capture_output=True, text=True, check=False, preexec_fn=child, pass_fds=[work]
        )
    finally:
        for fd in (*fds, exe, work, root):
            os.close(fd)
    assert r.returncode == nsenter.EXIT_REFUSED
    assert f"/proc/self/fd/{work} inside pid {pod.init_pid}'s mount namespace is not ours" in r.stdout
    assert sorted(p.name for p in markers.iterdir()) == []


def test_a_process_of_the_tree_in_a_user_namespace_of_its_own_is_refused(
    criu: Criu, pods: tuple[Pod, Path], tmp_path: Path
) -> None:
    """The pod's PID 1 is fine; the process to capture moved itself into a user namespace of its own."""
    pod, host_only = pods
    r = pod.exec("sh", "-c", "setsid -f unshare -U sleep 1000 </dev/null >/dev/null 2>&1")
    assert r.returncode == 0, r.stderr
    wait_for(lambda: len(_children(pod.init_pid)) == 1, what="the worker", timeout=20, interval=0.02)
    (worker,) = _children(pod.init_pid)
    wait_for(
        lambda: Path(f"/proc/{worker}/comm").read_text().strip() == "sleep",
        what="its user namespace",
        timeout=20,
        interval=0.02,
    )
    with pytest.raises(CaptureError, match=f"pid {worker} is in a user namespace of its own"):
        capture(worker, host_only / "snap", CaptureOptions(namespace_pid=pod.init_pid), criu=criu)
    assert proctree.is_alive(worker)
