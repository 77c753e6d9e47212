"""Namespace mode: CRIU runs inside "pods" (unshare'd PID + mount namespaces), reaching CRIU and the
artifact only through inherited directory descriptors: both are hidden (tmpfs over them) in the pods."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from podsnap.demo import round_trip
from podsnap.engine import CaptureError, CaptureOptions, Criu, RestoreOptions, capture, restore
from podsnap.engine import _proctree as proctree
from tests.support.processes import Pod, free_port, http_get

pytestmark = pytest.mark.slow


@pytest.fixture
def pods(criu: Criu, tmp_path: Path) -> Iterator[tuple[Pod, Pod, Path]]:
    host_only = tmp_path / "host-only"
    host_only.mkdir()
    hide = [host_only, criu.binary.exe.parent]
    if criu.binary.lib_dir is not None and criu.binary.lib_dir.parent != criu.binary.exe.parent:
        hide.append(criu.binary.lib_dir)
    src, dst = Pod(tmp_path / "pod-a", hide), None
    try:
        dst = Pod(tmp_path / "pod-b", hide)
        yield src, dst, host_only
    finally:
        src.stop()
        if dst is not None:
            dst.stop()


def test_capture_in_one_pod_restore_in_another(criu: Criu, pods: tuple[Pod, Pod, Path], tmp_path: Path) -> None:
    src, dst, host_only = pods
    # the pods cannot see CRIU or the artifact storage
    for pod in (src, dst):
        listing = pod.exec("ls", "-A", str(host_only), str(criu.binary.exe.parent))
        assert listing.returncode == 0, listing.stderr
        assert "criu" not in listing.stdout.split()
    port, ns_pid, init_id = src.start_worker(tmp_path / "worker")
    host_pid = proctree.host_pid_in_ns(ns_pid, src.init_pid)
    assert host_pid is not None and host_pid != ns_pid
    assert proctree.proc_info(host_pid).ppid == src.init_pid, "the worker is a child of the pod's PID 1"
    before = http_get(port)

    art = host_only / "snap"
    result = capture(host_pid, art, CaptureOptions(namespace_pid=src.init_pid), criu=criu)
    assert result.manifest.namespaced
    assert result.manifest.root.ns_pid == ns_pid
    assert not proctree.exists(host_pid)

    restored = restore(art, RestoreOptions(namespace_pid=dst.init_pid), criu=criu)
    assert restored.ns_pid == ns_pid, "same namespace PID inside the destination pod"
    assert proctree.pid_ns(restored.pid) == proctree.pid_ns(dst.init_pid)
    assert proctree.proc_info(restored.pid).ppid == dst.init_pid, "parented by the destination's PID 1"
    after = http_get(port)
    assert after["init_id"] == init_id == before["init_id"]
    assert after["requests"] == before["requests"] + 1


def test_namespaced_artifact_needs_a_namespace_to_restore_into(
    criu: Criu, pods: tuple[Pod, Pod, Path], tmp_path: Path
) -> None:
    from podsnap.engine import RestoreError

    src, _, host_only = pods
    _, ns_pid, _ = src.start_worker(tmp_path / "worker")
    host_pid = proctree.host_pid_in_ns(ns_pid, src.init_pid)
    assert host_pid is not None
    capture(host_pid, host_only / "snap", CaptureOptions(namespace_pid=src.init_pid), criu=criu)
    with pytest.raises(RestoreError, match="namespace"):
        restore(host_only / "snap", criu=criu)


def test_pid_1_of_a_pod_is_refused(criu: Criu, pods: tuple[Pod, Pod, Path]) -> None:
    src, _, host_only = pods
    with pytest.raises(CaptureError, match="PID 1"):
        capture(src.init_pid, host_only / "snap", CaptureOptions(namespace_pid=src.init_pid), criu=criu)
    assert proctree.is_alive(src.init_pid)


def test_a_bulk_region_round_trips_between_pods_through_the_parallel_fill(
    criu: Criu, pods: tuple[Pod, Pod, Path], tmp_path: Path
) -> None:
    """The fast restore in namespace mode: CRIU leaves the tree stopped inside the destination pod, the
    fill writes through the host PIDs, and the tree resumes there with its namespace PIDs."""
    src, dst, host_only = pods
    port, ns_pid, init_id = src.start_worker(tmp_path / "worker", bulk_mib=192)
    host_pid = proctree.host_pid_in_ns(ns_pid, src.init_pid)
    assert host_pid is not None
    before = http_get(port)
    cap = capture(host_pid, host_only / "snap", CaptureOptions(namespace_pid=src.init_pid), criu=criu)
    assert cap.manifest.bulk and {e.pid for e in cap.manifest.bulk} == {ns_pid}, "extents use namespace PIDs"

    restored = restore(
        host_only / "snap",
        RestoreOptions(namespace_pid=dst.init_pid, expected_manifest_digest=cap.manifest_digest),
        criu=criu,
    )
    assert "fill" in restored.timings_ms
    assert restored.ns_pid == ns_pid and restored.pid != ns_pid
    assert proctree.proc_info(restored.pid).ppid == dst.init_pid
    assert proctree.state(restored.pid) != "T", "resumed after the fill"
    after = http_get(port)
    assert after["bulk"] == before["bulk"] and after["init_id"] == init_id


def test_the_demo_round_trip_in_namespace_mode_on_the_cpu(criu: Criu, tmp_path: Path) -> None:
    """The code path of tests/gpu/test_cuda_roundtrip.py::test_in_namespace_mode..., without a GPU: the demo's
    sandboxes entered through checked namespace fds, CRIU exec'd through its fd."""
    report = round_trip(tmp_path, ["--device", "cpu"], port=free_port(), namespaces=True)
    assert report["restore"]["ns_pid"] == report["before"]["pid"] != report["restore"]["pid"], (
        "same namespace PID in the new sandbox, another host PID"
    )
