"""The agent's real executor (`EngineExecutor`) over real CRIU: capture a worker inside one "pod" (PID +
mount namespaces) by its host PID, restore it into another pod's namespaces, as the agent calls it."""

from __future__ import annotations

import hashlib
import json
import os
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from podsnap import contract as c
from podsnap import engine
from podsnap.agent.engine_executor import EngineExecutor
from podsnap.agent.executor import (
    ArtifactUnusable,
    CaptureRequest,
    ExecutionError,
    IncompatibleError,
    PodRef,
    RestoreRequest,
)
from podsnap.engine import _proctree as proctree  # white-box: pid namespace introspection
from tests.agent.requests import capture_request, restore_request
from tests.support.criu import criu_or_skip
from tests.support.processes import Pod, http_get

pytestmark = pytest.mark.slow


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[tuple[Pod, Pod]]:
    criu_or_skip()
    src = Pod(tmp_path / "pod-a", [])
    dst = Pod(tmp_path / "pod-b", [])
    try:
        yield src, dst
    finally:
        src.stop()
        dst.stop()


def test_engine_executor_moves_a_worker_between_pods(pods: tuple[Pod, Pod], tmp_path: Path) -> None:
    src, dst = pods
    port, ns_pid, init_id = src.start_worker(tmp_path / "worker")
    host_pid = proctree.host_pid_in_ns(ns_pid, src.init_pid)
    assert host_pid is not None
    before = http_get(port)
    artifact = tmp_path / "artifacts" / "ns" / "snap-uid"
    executor = EngineExecutor()

    result = executor.capture(capture_request(host_pid, artifact))
    assert result.size_bytes > 0 and result.digest.startswith("sha256:")
    assert result.source["arch"] and result.source["kernel"]
    assert result.timings_ms["criu_dump"] > 0 and result.timings_ms["total"] >= result.timings_ms["criu_dump"]
    assert (artifact / "manifest.json").exists()

    restored = executor.restore(restore_request(dst, artifact, result.digest))
    assert restored.pids and proctree.pid_ns(restored.pids[0]) == proctree.pid_ns(dst.init_pid)
    assert restored.timings_ms["criu_restore"] > 0 and "total" in restored.timings_ms
    after = http_get(port)
    assert after["init_id"] == init_id == before["init_id"]
    assert after["requests"] == before["requests"] + 1

    executor.remove(artifact)
    assert not artifact.exists()


def test_engine_errors_become_agent_reasons(pods: tuple[Pod, Pod], tmp_path: Path) -> None:
    src, _ = pods
    executor = EngineExecutor()
    ref = PodRef("ns", "src", "uid", "main", "containerd://" + "a" * 64)
    with pytest.raises(ExecutionError, match="PID 1") as caught:
        executor.capture(
            CaptureRequest(pod=ref, pids=(src.init_pid,), root_pid=src.init_pid, artifact_dir=tmp_path / "a", node="n")
        )
    assert caught.value.reason == "CaptureFailed" and not isinstance(caught.value, IncompatibleError)
    with pytest.raises(ExecutionError) as missing:
        executor.restore(
            RestoreRequest(
                pod=ref,
                placeholder_pids=(src.init_pid,),
                placeholder_root_pid=src.init_pid,
                artifact_dir=tmp_path / "none",
                skip_compat=False,
                node="n",
            )
        )
    assert missing.value.reason == "RestoreFailed"


def test_a_root_pid_that_names_another_process_than_the_one_found_is_refused(
    pods: tuple[Pod, Pod], tmp_path: Path
) -> None:
    """The PID was pinned by its start time when the agent found it in the container: if that process
    exited and the PID went to another by the time the capture or the restore starts, nothing runs."""
    src, dst = pods
    port, ns_pid, _ = src.start_worker(tmp_path / "worker")
    host_pid = proctree.host_pid_in_ns(ns_pid, src.init_pid)
    assert host_pid is not None
    before = http_get(port)
    started = engine.process_start_time(host_pid)
    assert started is not None
    executor = EngineExecutor()
    artifact = tmp_path / "artifacts" / "ns" / "snap"
    # what the agent would have read had the PID named an earlier process when it looked
    request = replace(capture_request(host_pid, artifact), root_start=started - 1)
    with pytest.raises(ExecutionError, match="now belongs to another process") as refused:
        executor.capture(request)
    assert refused.value.reason == c.REASON_CAPTURE_FAILED
    assert not artifact.exists()
    assert http_get(port)["init_id"] == before["init_id"], "the process the PID names now was not touched"

    result = executor.capture(replace(request, root_start=started))
    restore = replace(
        restore_request(dst, artifact, result.digest),
        placeholder_root_start=(engine.process_start_time(dst.init_pid) or 0) + 1,
    )
    in_dst = {p.pid for p in proctree.tree(dst.init_pid)}
    with pytest.raises(ExecutionError, match="now belongs to another process"):
        executor.restore(restore)
    assert {p.pid for p in proctree.tree(dst.init_pid)} == in_dst, "nothing was restored into the pod"
    executor.restore(replace(restore, placeholder_root_start=None))
    assert http_get(port)["init_id"] == before["init_id"]


def test_an_artifact_changed_after_its_capture_is_refused(pods: tuple[Pod, Pod], tmp_path: Path) -> None:
    """The manifest is trusted only through the digest recorded at capture (the content's status)."""
    src, dst = pods
    _, ns_pid, _ = src.start_worker(tmp_path / "worker")
    host_pid = proctree.host_pid_in_ns(ns_pid, src.init_pid)
    assert host_pid is not None
    artifact = tmp_path / "artifacts" / "ns" / "snap-uid"
    executor = EngineExecutor()
    result = executor.capture(capture_request(host_pid, artifact))
    manifest = artifact / "manifest.json"
    manifest.write_text(manifest.read_text() + " ")  # any change at all, even one a JSON reader ignores
    with pytest.raises(ExecutionError, match="changed after its capture") as refused:
        executor.restore(restore_request(dst, artifact, result.digest))
    assert refused.value.reason == "RestoreFailed"
    assert proctree.host_pid_in_ns(ns_pid, dst.init_pid) is None, "nothing was restored into the destination"


def test_an_artifact_in_a_newer_format_fails_the_restore_but_is_not_marked_lost(tmp_path: Path) -> None:
    """An agent older than the artifact (after a rollback, or not yet upgraded in a rolling upgrade) must not
    mark a newer checkpoint lost: it cannot read it, another agent can. A broken artifact still is lost."""
    artifact = tmp_path / "artifact"
    artifact.mkdir()
    newer = json.dumps({"schema": "podsnap.io/artifact", "schemaVersion": 99})
    (artifact / "manifest.json").write_text(newer)
    digest = "sha256:" + hashlib.sha256(newer.encode()).hexdigest()
    executor = EngineExecutor()
    for call in (executor.check, executor.artifact_files, executor.verify_artifact):
        with pytest.raises(ExecutionError, match="newer than this podsnap understands") as err:
            call(artifact, digest)
        assert not isinstance(err.value, ArtifactUnusable), f"{call.__name__} would mark it ArtifactLost"
        assert err.value.reason == c.REASON_RESTORE_FAILED
    (artifact / "manifest.json").write_text(newer.replace("99", "1"))  # changed after its capture
    with pytest.raises(ArtifactUnusable):
        executor.check(artifact, digest)


def test_a_huge_manifest_planted_on_the_volume_is_marked_lost_by_every_reader_without_being_read(
    tmp_path: Path,
) -> None:
    """Security finding 6: the periodic check, the cache's prefetch and every restore read manifest.json
    before its digest can be compared; a sparse 8 GiB one is refused by its size, as a lost artifact."""
    from podsnap.engine import MANIFEST_MAX_BYTES

    artifact = tmp_path / "artifact"
    artifact.mkdir()
    (artifact / "manifest.json").touch()
    os.truncate(artifact / "manifest.json", 8 << 30)
    digest = "sha256:" + "0" * 64
    executor = EngineExecutor()
    pod = PodRef("ns", "dst", "uid-b", "main", "containerd://" + "b" * 64)
    restore = RestoreRequest(pod=pod, placeholder_pids=(1,), placeholder_root_pid=1, artifact_dir=artifact,
                             skip_compat=False, node="n", expected_digest=digest)  # fmt: skip
    calls = {
        "check": lambda: executor.check(artifact, digest),
        "artifact_files": lambda: executor.artifact_files(artifact, digest),
        "verify_artifact": lambda: executor.verify_artifact(artifact, digest),
        "restore": lambda: executor.restore(restore),
    }
    for name, call in calls.items():
        tracemalloc.start()
        t0 = time.monotonic()
        try:
            with pytest.raises(ArtifactUnusable, match=f"8589934592 bytes, more than the {MANIFEST_MAX_BYTES}") as err:
                call()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert time.monotonic() - t0 < 1.0 and peak < 1 << 20, f"{name}: refused at once, nothing read"
        assert str(artifact / "manifest.json") in str(err.value), f"{name}: the message names the file"


def test_a_bad_journal_record_is_reported_and_removed_and_the_agent_starts(tmp_path: Path) -> None:
    """A malformed record (or one whose recovery raises) must not stop the node's agent from starting, nor be
    tried again at every start."""
    from podsnap.engine import _journal as journal  # white-box: the record's version

    journal_dir = tmp_path / "journal"
    journal_dir.mkdir()
    (journal_dir / "c-note.json").write_text(json.dumps({"version": journal.VERSION, "note": "x"}))
    (journal_dir / "c-json.json").write_text("{not json")
    (journal_dir / "c-fields.json").write_text(json.dumps({"version": journal.VERSION, "root": "x"}))
    found = EngineExecutor(journal_dir=journal_dir).recover_captures()
    assert sorted(f.content for f in found) == ["c-fields", "c-json", "c-note"]
    assert not any(f.source_alive for f in found)
    assert all("journal record not recovered" in f.summary for f in found), found
    assert not list(journal_dir.glob("*.json")), "reported once, never tried again"
