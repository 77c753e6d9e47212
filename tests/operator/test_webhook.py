"""The pod webhook as the real API server calls it (TLS, MutatingWebhookConfiguration from the chart with a
127.0.0.1 URL): policy pods shaped, others untouched, and an outage never blocks pod creation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from podsnap import contract as c
from podsnap.agent.executor import IncompatibleError
from podsnap.operator import main as operator_main
from tests.support.harness import cond_is
from tests.support.operator_env import (
    Env,
    deployment,
    kubelet_runs_restore_pod,
    pod_template,
    ready_policy_of,
    shaped,
)
from tests.support.waiting import wait_for


def test_pods_outside_any_policy_are_untouched(env: Env, ns: str, tmp_path: Path) -> None:
    env.cluster.kube.core.create_namespaced_pod(
        ns,
        {"metadata": {"name": "bare"}, "spec": {"containers": [{"name": "main", "image": "x", "command": ["serve"]}]}},
    )
    env.cluster.kube.apps.create_namespaced_deployment(ns, deployment("other", 1, pod_template("other", tmp_path)))
    pods = wait_for(lambda: len(p := env.cluster.pods(ns, "")) == 2 and p, what="2 pods")
    for pod in pods:
        assert not shaped(pod) and c.LABEL_RESTORE not in (pod["metadata"].get("labels") or {})
        assert pod["spec"]["containers"][0]["command"] in (["serve"], ["python", "-m", "worker"])
        assert not pod["spec"].get("shareProcessNamespace")


def test_webhook_outage_means_a_cold_start_not_a_blocked_rollout(env: Env, ns: str, tmp_path: Path) -> None:
    ready_policy_of(env, ns, pod_template("web", tmp_path))
    env.cluster.kube.apps.patch_namespaced_deployment("web", ns, {"spec": {"replicas": 1}})
    [first] = wait_for(lambda: env.cluster.pods(ns, "app=web"), what="first pod")
    assert shaped(first), "with the webhook up, the pod is shaped for restore"

    env.operator.stop()
    try:
        env.cluster.kube.apps.patch_namespaced_deployment("web", ns, {"spec": {"replicas": 2}})
        pods = wait_for(
            lambda: len(p := env.cluster.pods(ns, "app=web")) == 2 and p,
            timeout=30,
            what="second pod despite the outage",
        )
        [cold] = [p for p in pods if p["metadata"]["name"] != first["metadata"]["name"]]
        assert not shaped(cold) and cold["spec"]["containers"][0]["command"] == ["python", "-m", "worker"]
    finally:
        env.operator.ctx = operator_main.build_context(env.operator_ctx.config)
        env.operator.start()


def test_incompatible_restore_and_skip_annotation(env: Env, ns: str, tmp_path: Path) -> None:
    """A refused gate ends in a fallback whose cause is RestoreIncompatible naming the gate; the pod author's skip-compat-check is not
    honoured (only a SnapshotPolicy's skipCompatCheck is, through the restore token: tests/operator/test_tokens.py)."""
    control = tmp_path / "ctl"
    control.mkdir()
    template = pod_template("web", control)
    template["metadata"]["annotations"] = {c.ANNOTATION_SKIP_COMPAT_CHECK: "true"}
    ready_policy_of(env, ns, template)
    env.cluster.kube.apps.patch_namespaced_deployment("web", ns, {"spec": {"replicas": 1}})
    [pod] = wait_for(lambda: env.cluster.pods(ns, "app=web"), what="restore pod")
    name = pod["metadata"]["name"]
    env.executor.fail_restore[name] = IncompatibleError("gpu-model", "expected NVIDIA H200, found NVIDIA A100")
    kubelet_runs_restore_pod(env, ns, pod, control)
    got = wait_for(
        lambda: (
            cond_is(p := env.cluster.pod(ns, name), c.POD_CONDITION_RESTORED, "False", c.REASON_FELL_BACK_TO_COLD_START)
            and p
        ),
        what="FellBackToColdStart",
    )
    cond = next(x for x in got["status"]["conditions"] if x["type"] == c.POD_CONDITION_RESTORED)
    assert cond["message"].startswith(f"{c.REASON_RESTORE_INCOMPATIBLE}: gate gpu-model"), cond
    assert env.executor.of("restore", name, ns)[0].request.skip_compat is False
    assert got["metadata"]["annotations"][c.ANNOTATION_SKIP_COMPAT_CHECK] == "false", "the webhook says what applies"
    assert not (control / c.FILE_RESTORE_COMPLETE).exists()


def test_a_pod_naming_another_namespaces_replicaset_is_not_shaped_with_its_policy(
    env: Env, ns: str, tmp_path: Path
) -> None:
    """Finding 9, the attack: a pod created with no metadata.namespace (what kubectl run sends) whose
    ownerReference names another namespace's ReplicaSet, by name and uid (both readable wherever the
    ReplicaSet is). The webhook took the pod's namespace from the object, found none, and looked the owner up
    cluster-wide: the pod was shaped with the other namespace's policy (its restore token, its checkpoint).
    The owner is looked up only in the namespace of the admission request."""
    victim = env.cluster.namespace(f"{ns}-victim"[:63])
    template = pod_template("web", tmp_path / "ctl")
    owner = ready_policy_of(env, victim, template)

    def pod(name: str) -> dict[str, Any]:
        meta = {**template["metadata"], "name": name, "ownerReferences": [{**owner, "controller": True}]}
        assert "namespace" not in meta
        return {"metadata": meta, "spec": template["spec"]}

    core = env.cluster.kube.core
    stolen = env.cluster.kube.sanitize(core.create_namespaced_pod(ns, pod("stolen")))
    assert not shaped(stolen), stolen["metadata"]
    assert c.ANNOTATION_RESTORE_TOKEN not in (stolen["metadata"].get("annotations") or {})
    assert stolen["spec"]["containers"][0]["command"] == ["python", "-m", "worker"]
    # the same pod in the ReplicaSet's own namespace is the workload's: shaped (so the refusal above is the fix's)
    own = env.cluster.kube.sanitize(core.create_namespaced_pod(victim, pod("own")))
    assert shaped(own) and own["metadata"]["annotations"][c.ANNOTATION_RESTORE_FROM] == "golden", own["metadata"]
