"""The artifact volume filling up in the middle of a capture, on a real small filesystem (a tmpfs with a
size limit) with real CRIU on a real worker in a pod-like sandbox, as the agent's executor runs it: the
capture rolls back, nothing of it is left on the volume, its journal record is gone, the reason is
StorageFull, and a source the dump filled the volume under keeps serving."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from podsnap import contract as c
from podsnap.agent.engine_executor import EngineExecutor
from podsnap.agent.executor import CaptureRequest, ExecutionError, PodRef
from podsnap.engine import _proctree as proctree  # white-box: pid namespace introspection
from tests.support.criu import criu_or_skip
from tests.support.processes import Pod, http_get
from tests.support.small_fs import small_tmpfs

pytestmark = pytest.mark.slow


@pytest.fixture
def pod(tmp_path: Path) -> Iterator[Pod]:
    criu_or_skip()
    p = Pod(tmp_path / "pod", [])
    try:
        yield p
    finally:
        p.stop()


def test_a_volume_filling_during_the_criu_dump_rolls_back_as_storage_full_and_the_source_serves(
    pod: Pod, tmp_path: Path
) -> None:
    port, ns_pid, init_id = pod.start_worker(tmp_path / "worker", bulk_mib=96)
    host_pid = proctree.host_pid_in_ns(ns_pid, pod.init_pid)
    assert host_pid is not None
    with small_tmpfs(tmp_path / "volume", "32m") as volume:
        journal = tmp_path / "agent-state" / "journal"  # node-local, as the agent's (not on the volume)
        executor = EngineExecutor(log_dir=tmp_path / "logs", journal_dir=journal)
        ref = PodRef("ns", "src", "uid-a", "main", "containerd://" + "a" * 64)
        artifact = volume / "ns" / "snap-uid"
        with pytest.raises(ExecutionError) as failed:
            executor.capture(
                CaptureRequest(
                    pod=ref, pids=(host_pid,), root_pid=host_pid, artifact_dir=artifact, node="node-a", content="c-1"
                )
            )
        assert failed.value.reason == c.REASON_STORAGE_FULL, failed.value
        assert "criu_dump" in str(failed.value) and "the source keeps running" in str(failed.value)
        assert sorted(p.name for p in artifact.parent.iterdir()) == [], "no artifact, no staging dir left"
        assert list(journal.iterdir()) == [], "the journal record went with the rollback"
    assert http_get(port)["init_id"] == init_id, "the source serves on"
