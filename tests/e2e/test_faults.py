"""Faults on the real cluster, each ending with a replica that serves (restored or cold) within a bound,
the reason on the objects, the source not lost, and nothing of the test left on the artifact volume:

- the node agent SIGKILLed in the middle of a restore: the pod falls back to a cold start with cause
  AgentRestarted, and nothing of the half-restored worker is left running in it;
- the artifact deleted, or truncated, between capture and restore (on the volume and in the node cache):
  the pod falls back cold naming the cause, the PodSnapshot is Failed/ArtifactLost, the policy captures
  again;
- the artifact volume full: the capture is refused with StorageFull before it touches the source, the
  workload serves cold, and once there is room the policy captures again;
- the node agent absent while a PodSnapshot is deleted: its deletion still finishes, after the operator's
  wait for the agent, set short here.

test_failures.py holds the others of issue 12 (a corrupt artifact, an incompatible one, the agent killed
mid-capture). Every test here is marked `fault`: the suite ends with a count of the faults survived."""

from __future__ import annotations

import time

import pytest

from podsnap import contract
from podsnap.operator import orphans
from tests.e2e.support import artifacts
from tests.e2e.support.capture import run_capture
from tests.e2e.support.config import E2EConfig
from tests.e2e.support.faults import (
    AgentKiller,
    agent_absent,
    assert_one_worker,
    assert_serves_cold,
    clean_up,
    contents_of_namespace,
    fallback_cause,
    new_pod_after_scale,
    operator_env,
    restore_verdict,
    restored_condition,
    settled,
    wait_agent_rolled_out,
    warning_event,
)
from tests.e2e.support.flow import (
    capture_pods,
    demo_deployment,
    demo_service,
    init_id,
    policy,
    restore_from,
    snapshot_policy,
    wait_serving,
    worker_health,
)
from tests.e2e.support.k8s import Cluster, Pending, condition, pod_ready, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.fault]
APP = "worker"
#: from the agent's SIGKILL to the replica serving cold: the agent's container restarting, its start,
#: and a cold start of the demo worker
SERVES_AFTER_AGENT_KILL_S = 90.0


@pytest.mark.fault("agent killed mid-restore")
def test_the_agent_killed_mid_restore_leaves_the_replica_serving_cold_with_agent_restarted(
    cluster: Cluster, podsnap: E2EConfig, namespace: str
) -> None:
    run = run_capture(cluster, podsnap, namespace, APP)
    [first] = run.require_serving()
    node = first.spec.node_name
    known = settled(cluster, podsnap, namespace, APP)
    killer = AgentKiller(cluster, podsnap, node, timeout=podsnap.timeout_s)
    try:
        pod = new_pod_after_scale(cluster, podsnap, namespace, APP, known=known, replicas=2)
        killer.killed()
    finally:
        killer.stop()
    killed_at = time.monotonic()

    verdict = restore_verdict(cluster, podsnap, namespace, pod)
    cond = restored_condition(cluster, namespace, pod)
    assert verdict == f"False/{contract.REASON_FELL_BACK_TO_COLD_START}", f"{verdict}: {cond.message}"
    assert fallback_cause(cond) == contract.REASON_AGENT_RESTARTED, cond.message
    said = warning_event(cluster, podsnap, namespace, pod, contract.REASON_FELL_BACK_TO_COLD_START)
    assert said.startswith(f"{contract.REASON_AGENT_RESTARTED}: "), said
    body = assert_serves_cold(
        cluster,
        podsnap,
        namespace,
        pod,
        source_ids=run.source_init_ids,
        cause=contract.REASON_AGENT_RESTARTED,
        timeout=SERVES_AFTER_AGENT_KILL_S,
    )
    serving_after = time.monotonic() - killed_at
    assert serving_after < SERVES_AFTER_AGENT_KILL_S, f"served {serving_after:.0f} s after the agent's kill"
    # nothing half-restored runs next to the cold worker, and the replica restored before is untouched
    assert_one_worker(cluster, namespace, pod, body)
    assert init_id(worker_health(cluster, namespace, first.metadata.name, podsnap.demo_port)) in run.source_init_ids
    wait_agent_rolled_out(cluster, podsnap)
    clean_up(cluster, podsnap, namespace, APP, node)


#: what each damage must make the messages say
DAMAGE_WORDS = {
    "delete": ("no such artifact directory", "missing"),
    "truncate": ("truncated", "differs from the manifest"),
}


@pytest.mark.fault("artifact lost")
@pytest.mark.parametrize("how", sorted(DAMAGE_WORDS))
def test_an_artifact_lost_between_capture_and_restore_falls_back_cold_and_the_policy_captures_again(
    cluster: Cluster, podsnap: E2EConfig, namespace: str, how: str
) -> None:
    run = run_capture(cluster, podsnap, namespace, APP, serve=False)
    known = settled(cluster, podsnap, namespace, APP)
    content = artifacts.content_of(cluster, run.snapshot)
    node = content["spec"]["nodeName"]
    words = DAMAGE_WORDS[how]

    def names_cause(message: str | None) -> bool:
        return any(w in (message or "") for w in words)

    # the node cache's copy goes the same way: a good copy there would (rightly) restore
    artifacts.damage_everywhere(cluster, podsnap, content, how)
    pod = new_pod_after_scale(cluster, podsnap, namespace, APP, known=known, replicas=2)
    obj = cluster.core.read_namespaced_pod(pod, namespace)
    if restore_from(obj):
        verdict = restore_verdict(cluster, podsnap, namespace, pod)
        cond = restored_condition(cluster, namespace, pod)
        assert verdict == f"False/{contract.REASON_FELL_BACK_TO_COLD_START}", f"{verdict}: {cond.message}"
        assert fallback_cause(cond) == contract.REASON_RESTORE_FAILED, cond.message
        assert names_cause(cond.message), f"the fallback does not say the artifact was {how}d: {cond.message}"
        said = warning_event(cluster, podsnap, namespace, pod, contract.REASON_FELL_BACK_TO_COLD_START)
        assert said.startswith(f"{contract.REASON_RESTORE_FAILED}: ") and names_cause(said), said
        body = assert_serves_cold(
            cluster, podsnap, namespace, pod, source_ids=run.source_init_ids, cause=contract.REASON_RESTORE_FAILED
        )
        assert_one_worker(cluster, namespace, pod, body)
    else:
        # the agent's periodic check found it first: the snapshot was no longer Ready when the pod was made,
        # so the pod was never shaped for restore and started cold as any pod of a workload without one
        wait_serving(cluster, namespace, APP, 2, podsnap.timeout_s)

    name = run.snapshot["metadata"]["name"]

    def lost() -> dict | Pending:
        snap = cluster.get_custom(contract.PLURAL_POD_SNAPSHOTS, name, namespace) or {}
        failed = condition(snap, contract.COND_FAILED)
        ok = failed and failed["status"] == "True" and failed["reason"] == contract.REASON_ARTIFACT_LOST
        return failed if ok else Pending(str(snap.get("status")))

    failed = wait_until(lost, timeout=podsnap.timeout_s, what=f"PodSnapshot {name} Failed/ArtifactLost")
    assert names_cause(failed["message"]), f"ArtifactLost does not say the artifact was {how}d: {failed['message']}"
    said = warning_event(cluster, podsnap, namespace, name, contract.REASON_ARTIFACT_LOST)
    assert names_cause(said), said
    # the replica restored before the artifact was lost keeps serving as the source
    for earlier in known:
        assert init_id(worker_health(cluster, namespace, earlier, podsnap.demo_port)) in run.source_init_ids

    def recaptured() -> dict | Pending:
        status = (policy(cluster, namespace, APP) or {}).get("status") or {}
        done = status.get("ready") is True and status.get("checkpointName") not in (None, name)
        return status if done else Pending(str(status))

    status = wait_until(recaptured, timeout=3 * podsnap.timeout_s, what=f"policy {APP} Ready on a new capture")
    assert status["captureAttempt"] == 2, status
    clean_up(cluster, podsnap, namespace, APP, node)


@pytest.mark.fault("artifact volume full")
def test_a_full_artifact_volume_refuses_the_capture_with_storage_full_and_the_source_keeps_serving(
    cluster: Cluster, podsnap: E2EConfig, namespace: str
) -> None:
    with artifacts.volume_full(cluster, podsnap, namespace) as df:
        cluster.apply([snapshot_policy(APP, APP), demo_service(podsnap, APP), demo_deployment(podsnap, APP)], namespace)
        # the capture source answers until the refusal: a capture that froze it would stall these
        answers: list[tuple[int, str]] = []

        def storage_full() -> dict | Pending:
            for snap in cluster.list_custom(contract.PLURAL_POD_SNAPSHOTS, namespace):
                failed = condition(snap, contract.COND_FAILED)
                if failed and failed["status"] == "True":
                    return failed
            for pod in capture_pods(cluster, namespace):
                if pod_ready(pod) and pod.metadata.deletion_timestamp is None:
                    status, body = cluster.proxy(
                        f"namespaces/{namespace}/pods/{pod.metadata.name}:{podsnap.demo_port}/proxy/health", timeout=5
                    )
                    answers.append((status, init_id(body) if status == 200 else str(body)[:200]))
            return Pending(f"{len(answers)} answers from the source")

        failed = wait_until(storage_full, timeout=podsnap.timeout_s, interval=0.2, what="the capture refused")
        assert failed["reason"] == contract.REASON_STORAGE_FULL, f"{failed} ({df})"
        assert "free" in failed["message"] and "not touched" in failed["message"], failed["message"]
        [snap] = cluster.list_custom(contract.PLURAL_POD_SNAPSHOTS, namespace)
        said = warning_event(cluster, podsnap, namespace, snap["metadata"]["name"], contract.REASON_STORAGE_FULL)
        assert "free" in said, said
        assert answers and all(a[0] == 200 for a in answers), f"the source stopped answering: {answers}"
        assert len({a[1] for a in answers}) == 1, f"more than one worker answered as the source: {answers}"

        def job_failed() -> list[dict] | Pending:
            jobs = cluster.list_custom(contract.PLURAL_SNAPSHOT_JOBS, namespace)
            failed = [f for f in (condition(j, contract.COND_FAILED) for j in jobs) if f and f["status"] == "True"]
            return failed or Pending(str([j.get("status") for j in jobs]))

        jobs = wait_until(job_failed, timeout=podsnap.timeout_s, what="the SnapshotJob Failed")
        assert all(j["message"].startswith(f"{contract.REASON_STORAGE_FULL}: ") for j in jobs), jobs

        def policy_says() -> dict | Pending:
            ready = condition(policy(cluster, namespace, APP), contract.COND_READY) or {}
            ok = ready.get("reason") == contract.REASON_CHECKPOINT_FAILED
            return ready if ok else Pending(str(ready))

        ready = wait_until(policy_says, timeout=podsnap.timeout_s, what=f"policy {APP} CheckpointFailed")
        assert contract.REASON_STORAGE_FULL in ready["message"], ready
        # the workload is not lost: WaitForCheckpoint lets it start cold once the capture failed
        [pod] = wait_serving(cluster, namespace, APP, 1, podsnap.timeout_s)
        assert restore_from(pod) is None
        node = pod.spec.node_name
        for content in contents_of_namespace(cluster, namespace):
            assert (condition(content, contract.COND_FAILED) or {}).get("reason") == contract.REASON_STORAGE_FULL
    # with room again, the policy's next attempt (after its backoff) captures
    status = wait_until(
        lambda: ((policy(cluster, namespace, APP) or {}).get("status") or {}).get("ready") is True,
        timeout=3 * podsnap.timeout_s,
        what=f"policy {APP} Ready once the volume has room",
    )
    assert status
    assert (policy(cluster, namespace, APP) or {})["status"]["captureAttempt"] == 2
    clean_up(cluster, podsnap, namespace, APP, node)


#: the operator's wait for an absent agent here (chart cleanup.handoverAfterSeconds, 600 s by default),
#: counted from when the node stopped having a Ready agent (operator/agent_absence.py): then it hands the
#: deletion to another node's agent, or, with none anywhere, lets it finish
HANDOVER_S = 10
#: how long deleting a content may take with its node's agent absent: that wait, the operator's sweeps
#: that notice the absence and that it ran out, and the cascade's own latency on a loaded node (a kopf
#: retry among it); far below the 600 s default wait, which is what a hung deletion would show
DELETION_WITHOUT_AGENT_S = HANDOVER_S + 2 * orphans.SWEEP_S + 45


@pytest.mark.fault("agent absent during deletion")
def test_deleting_a_snapshot_while_its_nodes_agent_is_absent_finishes(
    cluster: Cluster, podsnap: E2EConfig, namespace: str
) -> None:
    run = run_capture(cluster, podsnap, namespace, APP, serve=False)
    content = artifacts.content_of(cluster, run.snapshot)
    node = content["spec"]["nodeName"]
    name = content["metadata"]["name"]
    with operator_env(cluster, podsnap, contract.ENV_CLEANUP_HANDOVER, str(HANDOVER_S)):
        removing_agents = time.monotonic()  # no agent can have gone before this
        with agent_absent(cluster, podsnap):
            cluster.kubectl(
                "delete",
                "-n",
                namespace,
                f"snapshotpolicy/{APP}",
                f"deployment/{APP}",
                f"service/{APP}",
                "--wait=false",
            )
            deleting = time.monotonic()
            wait_until(
                lambda: (
                    not cluster.list_custom(contract.PLURAL_POD_SNAPSHOTS, namespace)
                    and cluster.get_custom(contract.PLURAL_POD_SNAPSHOT_CONTENTS, name, None) is None
                ),
                timeout=DELETION_WITHOUT_AGENT_S,
                what=f"PodSnapshot {run.checkpoint} and {name} deleted while no agent runs",
            )
            done = time.monotonic()
    # the wait counts from the agent's absence, not the deletion (which may come after it ran out)
    took = done - removing_agents
    assert took >= HANDOVER_S - 1, f"deleted {took:.0f} s after the agents went: the operator did not wait for them"
    print(f"deletion without an agent: {done - deleting:.1f} s after the deletion, {took:.1f} s after the agents went")
    # another node's agent removed the artifact (ArtifactHandedOver); with none anywhere (a single node) the
    # deletion was let go with an Event saying the artifact is left, to be removed by hand
    events = cluster.core.list_namespaced_event("default", field_selector=f"involvedObject.name={name}").items
    reasons = {e.reason: e.message for e in events}
    left = artifacts.leftovers(cluster, podsnap, node, namespace)
    if left:
        assert orphans.REASON_ARTIFACT_LEFT in reasons, (
            f"the artifact was left ({left}) and no Event says so: {reasons}"
        )
        artifacts.in_artifact(cluster, podsnap, content, "import os, shutil; shutil.rmtree(os.environ['ARTIFACT'])")
    else:
        assert orphans.REASON_HANDED_OVER in reasons, reasons
    assert not artifacts.leftovers(cluster, podsnap, node, namespace)
