"""A restored worker belongs to its destination container's cgroups, not to the agent's: real CRIU moves a
worker between two pod-like sandboxes, the destination's PID 1 placed in cgroups of its own (what the
runtime does for a container), and the restored tree must come back in exactly those. Joining fails
loudly when the cgroup filesystem given is not the host's."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from podsnap.agent.engine_executor import EngineExecutor
from podsnap.agent.executor import ExecutionError
from podsnap.engine import _proctree as proctree  # white-box: pid namespace introspection
from tests.agent.requests import capture_request, restore_request
from tests.support.criu import criu_or_skip
from tests.support.processes import Pod, http_get

pytestmark = pytest.mark.slow

CGROUPFS = Path("/sys/fs/cgroup")
#: v1 hierarchies the test places the destination in (this machine's cluster runs cgroup v1)
HIERARCHIES = ("pids", "memory", "cpu")


def v1_hierarchies() -> list[str]:
    return [h for h in HIERARCHIES if (CGROUPFS / h / "cgroup.procs").exists()]


@contextlib.contextmanager
def container_cgroups(pid: int) -> Iterator[dict[str, str]]:
    """Moves `pid` into a fresh cgroup in each hierarchy, as a runtime does for a container; yields the paths."""
    name = f"podsnap-test/ctr-{uuid.uuid4().hex[:8]}"
    made: list[Path] = []
    try:
        for h in v1_hierarchies():
            d = CGROUPFS / h / name
            d.mkdir(parents=True)
            made.append(d)
            (d / "cgroup.procs").write_text(str(pid))
        yield dict.fromkeys(v1_hierarchies(), f"/{name}")
    finally:
        for d in made:
            for procs in (d / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (d.parent.parent / "cgroup.procs").write_text(procs)  # back to the root before rmdir
            with contextlib.suppress(OSError):
                d.rmdir()


def cgroups_of(pid: int) -> dict[str, str]:
    out = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, ctrl, path = line.split(":", 2)
        for h in ctrl.split(","):
            out[h] = path
    return out


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[tuple[Pod, Pod]]:
    criu_or_skip()
    if not v1_hierarchies():
        pytest.skip("no cgroup v1 hierarchies at /sys/fs/cgroup to place a container in")
    src = Pod(tmp_path / "pod-a", [])
    dst = Pod(tmp_path / "pod-b", [])
    try:
        yield src, dst
    finally:
        src.stop()
        dst.stop()


def capture(src: Pod, tmp_path: Path) -> tuple[Path, str, int, int]:
    port, ns_pid, _ = src.start_worker(tmp_path / "worker")
    host_pid = proctree.host_pid_in_ns(ns_pid, src.init_pid)
    assert host_pid is not None
    artifact = tmp_path / "artifacts" / "ns" / "snap-uid"
    result = EngineExecutor().capture(capture_request(host_pid, artifact))
    return artifact, result.digest, port, ns_pid


def test_the_restored_worker_lives_in_the_destination_containers_cgroups(pods: tuple[Pod, Pod], tmp_path: Path) -> None:
    src, dst = pods
    artifact, digest, port, _ = capture(src, tmp_path)
    with container_cgroups(dst.init_pid) as paths:
        restored = EngineExecutor(cgroup_root=CGROUPFS).restore(restore_request(dst, artifact, digest))
        assert http_get(port)["init_id"]
        mine = cgroups_of(restored.pids[0])
        assert {h: mine[h] for h in paths} == paths, f"restored worker in {mine}, its container in {paths}"


def test_a_cgroup_filesystem_that_is_not_the_hosts_fails_the_restore_loudly(
    pods: tuple[Pod, Pod], tmp_path: Path
) -> None:
    """What the agent's own /sys/fs/cgroup is in a container: the hierarchies, without the pods' cgroups."""
    src, dst = pods
    artifact, digest, _, ns_pid = capture(src, tmp_path)
    fake = tmp_path / "container-view"
    for h in v1_hierarchies():
        (fake / h).mkdir(parents=True)
        (fake / h / "cgroup.procs").write_text("")
    with container_cgroups(dst.init_pid), pytest.raises(ExecutionError, match="is not under") as failed:
        EngineExecutor(cgroup_root=fake).restore(restore_request(dst, artifact, digest))
    assert failed.value.reason == "RestoreFailed"
    assert proctree.host_pid_in_ns(ns_pid, dst.init_pid) is None, "nothing was restored into the destination"


def test_cgroups_are_read_as_the_host_names_them_from_a_private_cgroup_namespace(tmp_path: Path) -> None:
    """On cgroup v2 the agent's container has a cgroup namespace of its own: /proc/PID/cgroup of another
    container's process then reads `/../..`-relative there. The engine reads it in the host's namespace
    (PID 1's on a node; this test's own stands in for it, as this machine's PID 1 is not inspectable)."""
    if not v1_hierarchies() or subprocess.run(["unshare", "-C", "true"], check=False).returncode != 0:
        pytest.skip("needs root, cgroup v1 hierarchies and unshare -C")
    target = subprocess.Popen(["sleep", "120"])
    try:
        with container_cgroups(target.pid) as paths:
            reader = f"podsnap-test/reader-{uuid.uuid4().hex[:8]}"
            rdir = CGROUPFS / "pids" / reader
            rdir.mkdir(parents=True)
            try:
                code = (
                    "import sys; from podsnap.engine._proctree import cgroups_as_host_sees as h; "
                    f"print(open('/proc/{target.pid}/cgroup').read()); print('--'); "
                    f"print(h({target.pid}, host_pid={os.getpid()}))"
                )
                script = f'echo $$ > {rdir}/cgroup.procs; exec unshare -C {sys.executable} -c "{code}"'
                got = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True, timeout=60)
            finally:
                with contextlib.suppress(OSError):
                    rdir.rmdir()
        direct, _, host = got.stdout.partition("--")
        pids_direct = next(ln for ln in direct.splitlines() if ":pids:" in ln).split(":", 2)[2]
        pids_host = next(ln for ln in host.splitlines() if ":pids:" in ln).split(":", 2)[2]
        assert pids_direct.startswith("/.."), f"the namespace did not change the view: {pids_direct}"
        assert pids_host == paths["pids"]
    finally:
        target.kill()
        target.wait()
