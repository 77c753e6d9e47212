"""Steps 2-4 of the walkthrough under `startupPolicy: WaitForCheckpoint`: a SnapshotJob captures the
demo worker, no serving pod starts cold, the policy becomes ready naming its checkpoint, the serving
pod is restored from it (its answers carry the capture source's init id) and answers a chat
completion through the Service; scaling to three restores every replica from the one snapshot.

One capture serves the whole module (it is the expensive step); the tests read what it observed."""

from __future__ import annotations

from typing import Any

import pytest
from pytest_helm_charts.k8s.fixtures import NamespaceFactoryFunc

from podsnap import contract
from tests.e2e.support.capture import CaptureRun, restored_summary, run_capture
from tests.e2e.support.config import E2EConfig
from tests.e2e.support.flow import (
    Timings,
    chat,
    init_id,
    restore_from,
    restored,
    wait_serving,
    worker_health,
)
from tests.e2e.support.k8s import Cluster, Pending, condition, new_namespace, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
APP = "worker"
RESTORED = f"True/{contract.REASON_RESTORE_SUCCEEDED}"


@pytest.fixture(scope="module")
def run(cluster: Cluster, podsnap: E2EConfig, timings: Timings, namespace_factory: NamespaceFactoryFunc) -> CaptureRun:
    # pytest-helm-charts' module-scoped factory deletes the namespace after the module
    ns = new_namespace(cluster, namespace_factory, "wait-for-checkpoint")
    result = run_capture(cluster, podsnap, ns, APP, startup=contract.STARTUP_POLICY_WAIT)
    timings.values.update({f"wait_for_checkpoint_{k}": v for k, v in result.seconds.items()})
    return result


def test_a_snapshot_job_captures_the_worker(cluster: Cluster, run: CaptureRun, podsnap: E2EConfig) -> None:
    assert run.job, f"the policy names no SnapshotJob: {run.policy_status}"
    name = run.job["metadata"]["name"]

    def captured() -> dict[str, Any] | Pending:
        job = cluster.get_custom(contract.PLURAL_SNAPSHOT_JOBS, name, run.namespace) or {}
        cond = condition(job, contract.COND_CAPTURED)
        return job if cond and cond["status"] == "True" else Pending(str(job.get("status")))

    # the SnapshotJob's status follows its PodSnapshot's by a reconcile or two
    wait_until(captured, timeout=podsnap.timeout_s, what=f"SnapshotJob {name} Captured=True")
    ready = condition(run.snapshot, contract.COND_READY)
    assert ready and ready["status"] == "True", run.snapshot.get("status")
    artifact = (run.snapshot.get("status") or {}).get("artifact") or {}
    assert int(artifact.get("sizeBytes") or 0) > 0, f"PodSnapshot has no artifact size: {artifact}"


def test_no_serving_pod_starts_cold(run: CaptureRun) -> None:
    cold = {pod: state for pod, state in run.ready_while_capturing.items() if state != RESTORED}
    assert not cold, f"serving pods were Ready before the checkpoint, not restored: {cold}"


def test_the_policy_is_ready_and_names_its_checkpoint(run: CaptureRun) -> None:
    assert run.policy_status["ready"] is True
    assert run.checkpoint == run.snapshot["metadata"]["name"]


def test_the_serving_pod_is_restored_from_that_checkpoint(run: CaptureRun) -> None:
    (pod,) = run.require_serving()
    assert restored(pod) == RESTORED, restored_summary(run.serving)
    assert restore_from(pod) == run.checkpoint


def test_the_restored_worker_answers_with_the_source_init_id(
    cluster: Cluster, run: CaptureRun, podsnap: E2EConfig
) -> None:
    assert run.source_init_ids, "the capture source never answered /health before it was checkpointed"
    (pod,) = run.require_serving()
    health = worker_health(cluster, run.namespace, pod.metadata.name, podsnap.demo_port)
    assert init_id(health) in run.source_init_ids, (
        f"pod {pod.metadata.name} answers with init id {init_id(health)}, the source had {run.source_init_ids}: "
        "it re-initialized instead of being restored"
    )


def test_a_chat_completion_through_the_service_is_answered_by_the_restored_worker(
    cluster: Cluster, run: CaptureRun
) -> None:
    answer = chat(cluster, run.namespace, APP, "what is podsnap?")
    assert init_id(answer) in run.source_init_ids


def test_scaling_to_three_restores_every_replica_from_the_one_snapshot(
    cluster: Cluster, run: CaptureRun, podsnap: E2EConfig, timings: Timings
) -> None:
    with timings.measure("wait_for_checkpoint_scale_1_to_3"):
        cluster.apps.patch_namespaced_deployment_scale(APP, run.namespace, {"spec": {"replicas": 3}})
        pods = wait_serving(cluster, run.namespace, APP, 3, podsnap.timeout_s)
    summary = restored_summary(pods)
    assert all(state == (RESTORED, run.checkpoint) for state in summary.values()), summary
    ids = {init_id(worker_health(cluster, run.namespace, p.metadata.name, podsnap.demo_port)) for p in pods}
    assert ids <= run.source_init_ids, f"replicas answer with init ids {ids}, the source had {run.source_init_ids}"
    snapshots = cluster.list_custom(contract.PLURAL_POD_SNAPSHOTS, run.namespace)
    assert [s["metadata"]["name"] for s in snapshots] == [run.checkpoint], "more than one capture for one template"
