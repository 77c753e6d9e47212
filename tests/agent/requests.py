"""The capture and restore requests the agent's handlers hand its executor, for a worker moved between two
test pods (`tests/support/processes.Pod`) as `EngineExecutor` receives them."""

from __future__ import annotations

from pathlib import Path

from podsnap.agent.executor import CaptureRequest, PodRef, RestoreRequest
from tests.support.processes import Pod

SOURCE = PodRef("ns", "src", "uid-a", "main", "containerd://" + "a" * 64)
DESTINATION = PodRef("ns", "dst", "uid-b", "main", "containerd://" + "b" * 64)


def capture_request(host_pid: int, artifact: Path) -> CaptureRequest:
    """Capture the worker whose host PID is `host_pid` into `artifact`."""
    return CaptureRequest(pod=SOURCE, pids=(host_pid,), root_pid=host_pid, artifact_dir=artifact, node="n")


def restore_request(dst: Pod, artifact: Path, digest: str) -> RestoreRequest:
    """Restore `artifact` (recorded at capture with `digest`) into `dst`'s namespaces, next to its init."""
    return RestoreRequest(
        pod=DESTINATION,
        placeholder_pids=(dst.init_pid,),
        placeholder_root_pid=dst.init_pid,
        artifact_dir=artifact,
        skip_compat=False,
        node="n",
        expected_digest=digest,
    )
