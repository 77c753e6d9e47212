"""A SnapshotPolicy's failures cost speed, never availability (issue 16), against the real API server with
its controller-manager (Deployments, ReplicaSets) and the kubelet's part played:

- under WaitForCheckpoint a template change of a serving workload never takes its replicas away;
- a failed capture releases the workload, lets every pod the webhook held go (none stays Pending on a
  selector only podsnap satisfies), and is retried with a growing delay shown on the policy;
- a snapshot whose artifact is lost stops being Ready, its policy too, and the policy captures again.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest

from podsnap import contract as c
from podsnap.agent.executor import ExecutionError
from podsnap.kube.conditions import parse_time
from podsnap.operator.policy import held_pod
from tests.support.harness import cgroups_writable, cond_is, condition
from tests.support.operator_env import (
    NODE,
    RETRY_BASE_S,
    Env,
    deployment,
    get_policy,
    kubelet_starts_capture_pod,
    pod_template,
    policy,
    ready_policy,
    shaped,
)
from tests.support.waiting import wait_for

pytestmark = pytest.mark.skipif(cgroups_writable() is not None, reason=str(cgroups_writable()))


def replicas(env: Env, ns: str, name: str = "web") -> int:
    return int(env.cluster.kube.apps.read_namespaced_deployment(name, ns).spec.replicas)


def kubelet_serves(env: Env, ns: str, pod: dict[str, Any]) -> None:
    """The kubelet's part for a pod that serves: bound to NODE, its container running, Ready."""
    name = pod["metadata"]["name"]
    env.cluster.kubelet_bind(ns, name, NODE)
    proc = env.cluster.kubelet_container()
    env.cluster.kubelet_run(ns, name, ready=True, container_ids={"main": proc.container_id})


def policy_status(env: Env, ns: str) -> dict[str, Any]:
    return dict((get_policy(env, ns, "pol") or {}).get("status") or {})


def test_a_template_change_of_a_serving_workload_keeps_its_replicas(env: Env, ns: str, tmp_path: Path) -> None:
    # a Deployment serving cold (no policy yet), then a WaitForCheckpoint policy and a template change
    env.cluster.kube.apps.create_namespaced_deployment(ns, deployment("web", 1, pod_template("web", tmp_path)))
    [first] = wait_for(lambda: env.cluster.pods(ns, "app=web"), what="the first pod")
    kubelet_serves(env, ns, first)
    wait_for(
        lambda: env.cluster.kube.apps.read_namespaced_deployment("web", ns).status.available_replicas == 1,
        what="the Deployment serving",
    )
    env.cluster.create(
        c.PLURAL_SNAPSHOT_POLICIES, policy("pol", "Deployment", "web", startupPolicy=c.STARTUP_POLICY_WAIT), ns
    )
    first_hash = wait_for(lambda: policy_status(env, ns).get("templateHash"), what="the policy's first template")
    env.cluster.kube.apps.patch_namespaced_deployment(
        "web", ns, {"spec": {"template": {"metadata": {"annotations": {"rev": "2"}}}}}
    )
    status = wait_for(
        lambda: (s := policy_status(env, ns)).get("templateHash") not in (None, first_hash) and s,
        what="the policy on the new template",
    )
    assert status["holding"] is False, "a serving workload is never held"
    # the new template's pod starts cold (not held), and the serving replica was never taken away
    new = wait_for(
        lambda: [p for p in env.cluster.pods(ns, "app=web") if p["metadata"]["name"] != first["metadata"]["name"]],
        what="the new template's pod",
    )
    assert not held_pod(new[0]) and not shaped(new[0])
    assert replicas(env, ns) == 1
    assert env.cluster.pod(ns, first["metadata"]["name"]) is not None, "the serving pod is still there"
    assert c.ANNOTATION_HELD_REPLICAS not in (
        env.cluster.kube.apps.read_namespaced_deployment("web", ns).metadata.annotations or {}
    )


def test_a_failed_capture_releases_held_pods_and_is_retried_with_backoff(env: Env, ns: str, tmp_path: Path) -> None:
    env.executor.fail_capture_in[ns] = ExecutionError(
        "capture failed during criu_dump: no space left on device (full log: /var/lib/podsnap/artifacts/.logs/x/dump.log)",
        reason=c.REASON_CAPTURE_FAILED,
    )
    try:
        env.cluster.create(
            c.PLURAL_SNAPSHOT_POLICIES, policy("pol", "Deployment", "web", startupPolicy=c.STARTUP_POLICY_WAIT), ns
        )
        env.cluster.kube.apps.create_namespaced_deployment(ns, deployment("web", 2, pod_template("web", tmp_path)))
        job = wait_for(lambda: policy_status(env, ns).get("snapshotJobName"), what="the first SnapshotJob")
        wait_for(lambda: replicas(env, ns) == 0, what="held at zero while nothing serves")
        # a pod the webhook held before the hold (what the ReplicaSet made in the first instant)
        env.cluster.kube.core.create_namespaced_pod(
            ns,
            {
                "metadata": {"name": "early", "labels": {"app": "web"}},
                "spec": {
                    "containers": [{"name": "main", "image": "worker:1", "command": ["python"]}],
                    "nodeSelector": {c.SCHEDULING_GATE_WAIT: "true"},
                },
            },
        )
        kubelet_starts_capture_pod(env, ns, job)

        pol = wait_for(
            lambda: (
                cond_is(p := get_policy(env, ns, "pol"), c.COND_READY, "False", c.REASON_CHECKPOINT_FAILED)
                and p["status"].get("captureAttempt") == 2
                and p
            ),
            what="attempt 2 scheduled",
        )
        status, cond = pol["status"], condition(pol, c.COND_READY)
        assert cond is not None
        assert "capture attempt 1" in cond["message"] and "attempt 2 starts at" in cond["message"], cond["message"]
        assert "no space left on device" in cond["message"] and "\n" not in cond["message"]
        retry_at = parse_time(status["nextCaptureAt"])
        assert retry_at is not None and retry_at > datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=1)
        assert status["holding"] is False

        # the workload serves cold meanwhile: replicas back, and nothing left Pending on podsnap's selector
        wait_for(lambda: replicas(env, ns) == 2, what="replicas given back")
        wait_for(lambda: env.cluster.pod(ns, "early") is None, what="the held pod deleted")
        pods = wait_for(lambda: len(p := env.cluster.pods(ns, "app=web")) == 2 and p, what="2 pods, started cold")
        assert not any(held_pod(p) or shaped(p) for p in pods), [p["metadata"]["name"] for p in pods]

        # attempt 2 starts after the delay; it succeeds once the cause is gone
        del env.executor.fail_capture_in[ns]
        job2 = wait_for(
            lambda: (n := policy_status(env, ns).get("snapshotJobName")) != job and n,
            timeout=RETRY_BASE_S + 30,
            what="the SnapshotJob of attempt 2",
        )
        started = parse_time((env.cluster.get(c.PLURAL_SNAPSHOT_JOBS, job2, ns) or {})["metadata"]["creationTimestamp"])
        assert started is not None and retry_at is not None and started >= retry_at - datetime.timedelta(seconds=1)
        kubelet_starts_capture_pod(env, ns, job2)
        pol = ready_policy(env, ns, "pol")
        assert pol["status"]["checkpointName"] == job2 and pol["status"]["captureAttempt"] == 2
        assert env.cluster.get(c.PLURAL_SNAPSHOT_JOBS, job, ns) is None, "the failed attempt is cleaned up"
    finally:
        env.executor.fail_capture_in.pop(ns, None)


def test_a_lost_artifact_unreadies_snapshot_and_policy_and_the_policy_captures_again(
    env: Env, ns: str, tmp_path: Path
) -> None:
    env.cluster.create(c.PLURAL_SNAPSHOT_POLICIES, policy("pol", "Deployment", "web"), ns)
    env.cluster.kube.apps.create_namespaced_deployment(ns, deployment("web", 0, pod_template("web", tmp_path)))
    job = wait_for(lambda: policy_status(env, ns).get("snapshotJobName"), what="the SnapshotJob")
    kubelet_starts_capture_pod(env, ns, job)
    pol = ready_policy(env, ns, "pol")
    snapshot = env.cluster.get(c.PLURAL_POD_SNAPSHOTS, pol["status"]["checkpointName"], ns)
    assert snapshot is not None
    content = env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, c.content_name(snapshot["metadata"]["uid"]))
    assert content is not None
    artifact = env.artifact_root / content["spec"]["artifactPath"]
    (artifact / "manifest.json").unlink()  # the volume lost it

    failed = wait_for(
        lambda: (
            cond_is(
                s := env.cluster.get(c.PLURAL_POD_SNAPSHOTS, snapshot["metadata"]["name"], ns),
                c.COND_FAILED,
                reason=c.REASON_ARTIFACT_LOST,
            )
            and s
        ),
        what="the snapshot Failed/ArtifactLost",
    )
    assert cond_is(failed, c.COND_READY, "False", c.REASON_ARTIFACT_LOST)
    wait_for(
        lambda: (
            cond_is(get_policy(env, ns, "pol"), c.COND_READY, "False", c.REASON_CHECKPOINT_FAILED)
            and policy_status(env, ns).get("ready") is False
        ),
        what="the policy not Ready",
    )
    events = [e for e in env.cluster.kube.core.list_namespaced_event(ns).items if e.reason == c.REASON_ARTIFACT_LOST]
    assert events and events[0].type == "Warning"

    # new pods start cold meanwhile
    env.cluster.kube.apps.patch_namespaced_deployment("web", ns, {"spec": {"replicas": 1}})
    [pod] = wait_for(lambda: env.cluster.pods(ns, "app=web"), what="a new pod")
    assert not shaped(pod), "no pod restores from a lost artifact"

    # and the policy captures again
    job2 = wait_for(
        lambda: (n := policy_status(env, ns).get("snapshotJobName")) != job and n,
        timeout=RETRY_BASE_S + 30,
        what="a new capture",
    )
    kubelet_starts_capture_pod(env, ns, job2)
    assert ready_policy(env, ns, "pol")["status"]["checkpointName"] == job2
