"""Failures end visibly and safely: a corrupt artifact fails the restore, a snapshot from an incompatible
node is refused with RestoreIncompatible (and either way the pod serves, started cold, with
Restored=False/FellBackToColdStart naming the cause: a restore that cannot happen costs speed, never
availability), and an agent killed in the middle of a capture leaves a
failed job with a reason (or a retry that succeeds), never a lost worker. Each ends with nothing of its
namespace left on the artifact volume once its objects are deleted (support/faults.py: clean_up)."""

from __future__ import annotations

import time

import pytest

from podsnap import contract
from tests.e2e.support import artifacts
from tests.e2e.support.capture import run_capture
from tests.e2e.support.config import E2EConfig
from tests.e2e.support.faults import (
    assert_serves_cold,
    clean_up,
    new_pod_after_scale,
    restore_verdict,
    restored_condition,
    settled,
)
from tests.e2e.support.flow import demo_deployment, demo_service, policy, snapshot_policy, wait_serving
from tests.e2e.support.k8s import Cluster, Pending, condition, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.fault]
APP = "worker"


@pytest.mark.fault("corrupt artifact")
def test_a_corrupt_artifact_fails_the_restore_and_the_pod_never_serves(
    cluster: Cluster, podsnap: E2EConfig, namespace: str
) -> None:
    run = run_capture(cluster, podsnap, namespace, APP, serve=False)
    known = settled(cluster, podsnap, namespace, APP)
    content = artifacts.content_of(cluster, run.snapshot)
    # the node-local cache's verified copy is corrupted too: its seal must drop it (a good copy would restore)
    artifacts.corrupt_everywhere(cluster, podsnap, content)
    pod = new_pod_after_scale(cluster, podsnap, namespace, APP, known=known, replicas=2)
    verdict = restore_verdict(cluster, podsnap, namespace, pod)
    assert verdict == f"False/{contract.REASON_FELL_BACK_TO_COLD_START}", verdict
    cond = restored_condition(cluster, namespace, pod)
    assert (cond.message or "").startswith(f"{contract.REASON_RESTORE_FAILED}: "), cond.message
    assert cond.message and any(
        w in cond.message.lower() for w in ("digest", "sha256", "corrupt", "tamper", "mismatch")
    ), f"RestoreFailed does not say the artifact is corrupt: {cond.message}"
    assert_serves_cold(
        cluster, podsnap, namespace, pod, source_ids=run.source_init_ids, cause=contract.REASON_RESTORE_FAILED
    )
    # no later pod may restore from it: the snapshot is Failed/ArtifactLost, and the policy captures again
    name = run.snapshot["metadata"]["name"]

    def lost() -> dict | Pending:
        snap = cluster.get_custom(contract.PLURAL_POD_SNAPSHOTS, name, namespace) or {}
        failed = condition(snap, contract.COND_FAILED)
        ok = failed and failed["status"] == "True" and failed["reason"] == contract.REASON_ARTIFACT_LOST
        return snap if ok else Pending(str(snap.get("status")))

    wait_until(lost, timeout=podsnap.timeout_s, what=f"PodSnapshot {name} Failed/ArtifactLost")

    def recaptured() -> dict | Pending:
        status = (policy(cluster, namespace, APP) or {}).get("status") or {}
        done = status.get("ready") is True and status.get("checkpointName") not in (None, name)
        return status if done else Pending(str(status))

    status = wait_until(recaptured, timeout=3 * podsnap.timeout_s, what=f"policy {APP} Ready on a new capture")
    assert status["captureAttempt"] == 2, status
    clean_up(cluster, podsnap, namespace, APP, content["spec"]["nodeName"])


@pytest.mark.fault("incompatible artifact")
def test_a_snapshot_from_an_incompatible_node_is_refused_with_restore_incompatible(
    cluster: Cluster, podsnap: E2EConfig, namespace: str
) -> None:
    run = run_capture(cluster, podsnap, namespace, APP, serve=False)
    known = settled(cluster, podsnap, namespace, APP)
    content = artifacts.content_of(cluster, run.snapshot)
    # this cluster may have one node: the snapshot is made to claim another kernel than the target's, as if
    # captured so (its recorded digest follows; otherwise the changed manifest alone fails the restore)
    digest = artifacts.in_artifact(cluster, podsnap, content, artifacts.OTHER_KERNEL)
    artifacts.record_digest(cluster, content, digest)
    pod = new_pod_after_scale(cluster, podsnap, namespace, APP, known=known, replicas=2)
    verdict = restore_verdict(cluster, podsnap, namespace, pod)
    assert verdict == f"False/{contract.REASON_FELL_BACK_TO_COLD_START}", verdict
    cond = restored_condition(cluster, namespace, pod)
    assert (cond.message or "").startswith(f"{contract.REASON_RESTORE_INCOMPATIBLE}: "), cond.message
    assert "kernel" in (cond.message or ""), f"RestoreIncompatible does not name the failed gate: {cond.message}"
    assert_serves_cold(
        cluster, podsnap, namespace, pod, source_ids=run.source_init_ids, cause=contract.REASON_RESTORE_INCOMPATIBLE
    )
    clean_up(cluster, podsnap, namespace, APP, content["spec"]["nodeName"])


@pytest.mark.fault("agent killed mid-capture")
def test_killing_the_agent_mid_capture_fails_the_job_with_a_reason_or_retries_and_the_worker_still_serves(
    cluster: Cluster, podsnap: E2EConfig, namespace: str
) -> None:
    cluster.apply([snapshot_policy(APP, APP), demo_service(podsnap, APP), demo_deployment(podsnap, APP)], namespace)

    def capturing() -> dict | None:
        snaps = cluster.list_custom(contract.PLURAL_POD_SNAPSHOTS, namespace)
        return snaps[0] if snaps and (snaps[0].get("status") or {}).get("boundSnapshotContentName") else None

    snapshot = wait_until(
        capturing, timeout=podsnap.timeout_s, what="a PodSnapshot bound to a content (capture started)"
    )
    content = artifacts.content_of(cluster, snapshot)
    agent = artifacts.agent_pod(cluster, podsnap, content["spec"]["nodeName"])
    cluster.kubectl(
        "delete", "pod", "-n", podsnap.release_namespace, agent, "--grace-period=0", "--force", "--wait=false"
    )
    killed_at = time.monotonic()

    def outcome() -> str | None:
        pol = policy(cluster, namespace, APP) or {}
        if (pol.get("status") or {}).get("ready") is True:
            return "retried"
        jobs = cluster.list_custom(contract.PLURAL_SNAPSHOT_JOBS, namespace)
        failed = [condition(j, contract.COND_FAILED) for j in jobs]
        return "failed" if any(f and f["status"] == "True" for f in failed) else None

    result = wait_until(
        outcome, timeout=podsnap.timeout_s, what="the capture to fail with a reason or succeed on retry"
    )
    if result == "failed":
        for job in cluster.list_custom(contract.PLURAL_SNAPSHOT_JOBS, namespace):
            failed = condition(job, contract.COND_FAILED)
            if failed and failed["status"] == "True":
                assert failed.get("reason") and failed.get("message"), f"failed SnapshotJob says not why: {failed}"
    # either way the workload is not lost: it serves (restored after a retry, or released to start cold)
    wait_serving(cluster, namespace, APP, 1, podsnap.timeout_s)
    # and the agent comes back for everything after this test
    cluster.kubectl(
        "rollout", "status", f"daemonset/{podsnap.agent_daemonset}", "-n", podsnap.release_namespace,
        f"--timeout={int(podsnap.timeout_s)}s", timeout=podsnap.timeout_s + 30,
    )  # fmt: skip
    assert time.monotonic() - killed_at < 3 * podsnap.timeout_s
    # what the killed capture had staged is gone with its content
    clean_up(cluster, podsnap, namespace, APP, content["spec"]["nodeName"])
