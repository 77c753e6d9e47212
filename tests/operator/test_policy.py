"""SnapshotPolicy for Deployments and StatefulSets with the webhook called by the real API server over
TLS; the test plays the kubelet (binds pods, runs their containers as real processes, reports status)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from kubernetes import watch

from podsnap import contract as c
from podsnap.operator import placeholder
from tests.support.harness import cgroups_writable, cond_is
from tests.support.operator_env import (
    NODE,
    Env,
    deployment,
    get_policy,
    kubelet_runs_restore_pod,
    kubelet_starts_capture_pod,
    pod_template,
    podsnapshot,
    policy,
    ready_policy,
    running_pod,
    shaped,
)
from tests.support.waiting import wait_for

pytestmark = pytest.mark.skipif(cgroups_writable() is not None, reason=str(cgroups_writable()))


class PodRecorder:
    """Every pod of a namespace as the API server admitted it (after the webhook)."""

    def __init__(self, env: Env, ns: str) -> None:
        self.pods: list[dict[str, Any]] = []
        self._w = watch.Watch()
        started = threading.Event()

        def run() -> None:
            started.set()
            try:
                for ev in self._w.stream(env.cluster.kube.core.list_namespaced_pod, ns, timeout_seconds=120):
                    if ev["type"] == "ADDED":
                        self.pods.append(env.cluster.kube.sanitize(ev["object"]))
            except Exception:  # the stream is cut when the test stops it
                return

        threading.Thread(target=run, daemon=True).start()
        started.wait(5)

    def stop(self) -> None:
        self._w.stop()


def test_wait_for_checkpoint_deployment_restores_every_serving_pod(env: Env, ns: str, tmp_path: Path) -> None:
    control_dir = tmp_path / "control"
    control_dir.mkdir()
    recorder = PodRecorder(env, ns)
    env.cluster.create(
        c.PLURAL_SNAPSHOT_POLICIES, policy("pol", "Deployment", "web", startupPolicy=c.STARTUP_POLICY_WAIT), ns
    )
    wait_for(
        lambda: cond_is(get_policy(env, ns, "pol"), c.COND_READY, "False", c.REASON_TARGET_NOT_FOUND),
        what="TargetNotFound",
    )
    env.cluster.kube.apps.create_namespaced_deployment(ns, deployment("web", 2, pod_template("web", control_dir)))

    # held at zero until the checkpoint is Ready, with the desired count remembered
    dep = wait_for(
        lambda: (d := env.cluster.kube.apps.read_namespaced_deployment("web", ns)).spec.replicas == 0 and d,
        what="held at 0",
    )
    assert dep.metadata.annotations[c.ANNOTATION_HELD_REPLICAS] == "2"
    pol = wait_for(
        lambda: ((p := get_policy(env, ns, "pol")) or {}).get("status", {}).get("snapshotJobName") and p,
        what="SnapshotJob",
    )
    job_name = pol["status"]["snapshotJobName"]
    sj = env.cluster.get(c.PLURAL_SNAPSHOT_JOBS, job_name, ns)
    assert sj is not None and sj["metadata"]["labels"][c.LABEL_TEMPLATE_HASH] == pol["status"]["templateHash"]
    assert sj["metadata"]["labels"][c.LABEL_POLICY] == "pol"
    wait_for(
        lambda: cond_is(get_policy(env, ns, "pol"), c.COND_READY, "False", c.REASON_CHECKPOINT_PENDING),
        what="CheckpointPending",
    )

    kubelet_starts_capture_pod(env, ns, job_name)
    pol = ready_policy(env, ns, "pol")
    assert pol["status"]["checkpointName"] == job_name
    wait_for(
        lambda: cond_is(get_policy(env, ns, "pol"), c.COND_READY, reason=c.REASON_CHECKPOINT_READY),
        what="CheckpointReady",
    )
    dep = wait_for(
        lambda: (d := env.cluster.kube.apps.read_namespaced_deployment("web", ns)).spec.replicas == 2 and d,
        what="released",
    )
    assert c.ANNOTATION_HELD_REPLICAS not in (dep.metadata.annotations or {})

    pods = wait_for(
        lambda: len(p := [x for x in env.cluster.pods(ns, "app=web") if shaped(x)]) == 2 and p,
        timeout=30,
        what="2 restore pods",
    )
    for pod in pods:
        spec = pod["spec"]
        assert pod["metadata"]["annotations"][c.ANNOTATION_RESTORE_FROM] == job_name
        assert pod["metadata"]["labels"][c.LABEL_RESTORE] == "true"
        assert spec["shareProcessNamespace"] is True
        main = spec["containers"][0]
        assert main["command"] == placeholder.command(["python", "-m", "worker"])
        assert main["startupProbe"]["exec"]["command"] == ["sh", "-c", placeholder.STARTUP_PROBE_SCRIPT]
        assert c.SCHEDULING_GATE_WAIT not in (spec.get("nodeSelector") or {})
    # no serving pod ever started cold: every pod admitted before Ready was gated
    recorder.stop()
    for pod in recorder.pods:
        if (pod["metadata"].get("labels") or {}).get("app") == "web":
            assert shaped(pod) or (pod["spec"].get("nodeSelector") or {}).get(c.SCHEDULING_GATE_WAIT) == "true", pod[
                "metadata"
            ]["name"]

    procs = {pod["metadata"]["name"]: kubelet_runs_restore_pod(env, ns, pod, control_dir) for pod in pods}
    for name, proc in procs.items():
        restored = wait_for(
            lambda name=name: (
                cond_is(p := env.cluster.pod(ns, name), c.POD_CONDITION_RESTORED, reason=c.REASON_RESTORE_SUCCEEDED)
                and p
            ),
            what=f"{name} Restored",
        )
        assert (
            restored["metadata"]["annotations"][c.ANNOTATION_RESTORED_CONTAINER_IDS]
            == f"containerd://{proc.container_id}"
        )
        [call] = env.executor.of("restore", name, ns)
        assert call.request.placeholder_root_pid == proc.pid and not call.request.skip_compat
    context = c.RestoreContext.from_json((control_dir / c.FILE_RESTORE_CONTEXT).read_text())
    assert context.env["POD_NAME"] in procs and context.env["POD_NAMESPACE"] == ns
    assert context.env["POD_IP"] and context.env["NODE_NAME"] == NODE and context.env["MODEL"] == "tiny"
    assert (control_dir / c.FILE_RESTORE_COMPLETE).exists()

    # a new template is a new capture (one SnapshotJob per template hash); the old checkpoint stays
    env.cluster.kube.apps.patch_namespaced_deployment(
        "web", ns, {"spec": {"template": pod_template("web", control_dir, image="worker:2")}}
    )
    new = wait_for(
        lambda: (
            ((p := get_policy(env, ns, "pol")) or {}).get("status", {}).get("snapshotJobName") not in (None, job_name)
            and p
        ),
        what="new SnapshotJob",
    )
    assert new["status"]["templateHash"] != pol["status"]["templateHash"] and new["status"]["ready"] is False
    jobs = env.cluster.kube.custom.list_namespaced_custom_object(
        c.GROUP, c.VERSION, ns, c.PLURAL_SNAPSHOT_JOBS, label_selector=f"{c.LABEL_POLICY}=pol"
    )["items"]
    assert len({j["metadata"]["labels"][c.LABEL_TEMPLATE_HASH] for j in jobs}) == 2

    # deletionPolicy Delete (the default): the policy takes its captures with it and gives the replicas back
    env.cluster.kube.custom.delete_namespaced_custom_object(c.GROUP, c.VERSION, ns, c.PLURAL_SNAPSHOT_POLICIES, "pol")
    wait_for(lambda: get_policy(env, ns, "pol") is None, what="policy gone")
    for plural in (c.PLURAL_SNAPSHOT_JOBS, c.PLURAL_POD_SNAPSHOTS):
        wait_for(
            lambda plural=plural: (
                not env.cluster.kube.custom.list_namespaced_custom_object(
                    c.GROUP, c.VERSION, ns, plural, label_selector=f"{c.LABEL_POLICY}=pol"
                )["items"]
            ),
            what=f"{plural} deleted",
        )
    assert env.cluster.kube.apps.read_namespaced_deployment("web", ns).spec.replicas == 2


def statefulset(name: str, replicas: int, template: dict[str, Any]) -> dict[str, Any]:
    body = deployment(name, replicas, template)
    body["spec"]["serviceName"] = name
    return body


def test_immediate_statefulset_reuses_a_checkpoint_and_retains_it(env: Env, ns: str, tmp_path: Path) -> None:
    """Immediate: pods made before Ready start cold; pods made after restore. checkpointRef skips capture."""
    running_pod(env, ns, "source", job="golden")
    env.cluster.create(c.PLURAL_POD_SNAPSHOTS, podsnapshot("golden", "source"), ns)
    wait_for(lambda: cond_is(env.cluster.get(c.PLURAL_POD_SNAPSHOTS, "golden", ns), c.COND_READY), what="golden Ready")

    env.cluster.kube.apps.create_namespaced_stateful_set(ns, statefulset("db", 1, pod_template("db", tmp_path)))
    cold = wait_for(lambda: env.cluster.pod(ns, "db-0"), what="db-0")
    assert not shaped(cold) and cold["spec"]["containers"][0]["command"] == ["python", "-m", "worker"]

    env.cluster.create(
        c.PLURAL_SNAPSHOT_POLICIES,
        policy("pol", "StatefulSet", "db", checkpointRef={"name": "golden"}, deletionPolicy=c.DELETION_POLICY_RETAIN),
        ns,
    )
    pol = ready_policy(env, ns, "pol")
    assert pol["status"]["checkpointName"] == "golden" and "snapshotJobName" not in pol["status"]
    assert not env.cluster.kube.custom.list_namespaced_custom_object(c.GROUP, c.VERSION, ns, c.PLURAL_SNAPSHOT_JOBS)[
        "items"
    ]

    # the StatefulSet controller creates db-1 only once db-0 is Running and Ready: the kubelet's part
    env.cluster.kubelet_bind(ns, "db-0", NODE)
    env.cluster.kubelet_run(ns, "db-0", ready=True)
    env.cluster.kube.apps.patch_namespaced_stateful_set("db", ns, {"spec": {"replicas": 2}})
    db1 = wait_for(lambda: env.cluster.pod(ns, "db-1"), timeout=30, what="db-1")
    assert db1["metadata"]["annotations"][c.ANNOTATION_RESTORE_FROM] == "golden"
    assert db1["spec"]["containers"][0]["command"] == placeholder.command(["python", "-m", "worker"])

    env.cluster.kube.custom.delete_namespaced_custom_object(c.GROUP, c.VERSION, ns, c.PLURAL_SNAPSHOT_POLICIES, "pol")
    wait_for(lambda: get_policy(env, ns, "pol") is None, what="policy gone")
    assert env.cluster.get(c.PLURAL_POD_SNAPSHOTS, "golden", ns) is not None, (
        "Retain (and checkpointRef) keep the snapshot"
    )
