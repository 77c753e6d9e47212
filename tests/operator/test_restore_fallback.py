"""A restore that cannot work costs speed, never availability: under a SnapshotPolicy's
`restoreFailurePolicy: ColdStart` (the default) the pod says FellBackToColdStart (with the cause) and its
placeholder is told to start the worker cold; under `Fail` the pod keeps the cause as its reason and the
placeholder holds. The webhook carries the effective policy and the restore timeouts into the pod.
Real API server, webhook and agent; the executor is the recording fake (no kubelet, no CRIU here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from podsnap import contract as c
from podsnap.agent.executor import IncompatibleError
from podsnap.operator.restore_pod import Timeouts, shape
from tests.support.harness import condition
from tests.support.operator_env import (
    Env,
    deployment,
    golden,
    kubelet_runs_restore_pod,
    pod_template,
    policy,
    ready_policy,
    shaped,
)
from tests.support.waiting import wait_for

REFUSED = IncompatibleError("gpu-model", "expected NVIDIA H200, found NVIDIA A100")


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env") or []}


def restore_pod_of_policy(env: Env, ns: str, control: Path, **policy_spec: Any) -> dict[str, Any]:
    """A Deployment under a Ready SnapshotPolicy (`policy_spec` added), scaled to one shaped pod."""
    golden(env, ns)
    control.mkdir()
    env.cluster.kube.apps.create_namespaced_deployment(ns, deployment("web", 0, pod_template("web", control)))
    spec = {"checkpointRef": {"name": "golden"}, **policy_spec}
    env.cluster.create(c.PLURAL_SNAPSHOT_POLICIES, policy("pol", "Deployment", "web", **spec), ns)
    ready_policy(env, ns, "pol")
    env.cluster.kube.apps.patch_namespaced_deployment("web", ns, {"spec": {"replicas": 1}})
    [pod] = wait_for(lambda: env.cluster.pods(ns, "app=web"), what="the restore pod")
    assert shaped(pod)
    return pod


def verdict(env: Env, ns: str, name: str) -> dict[str, Any]:
    def terminal() -> dict[str, Any] | None:
        cond = condition(env.cluster.pod(ns, name), c.POD_CONDITION_RESTORED)
        return cond if cond and cond["reason"] != c.REASON_RESTORE_IN_PROGRESS else None

    return wait_for(terminal, what=f"a restore verdict on {name}")


def refused_restore(env: Env, ns: str, pod: dict[str, Any], control: Path) -> dict[str, Any]:
    """The kubelet runs the restore pod, the agent's executor refuses its restore (REFUSED): the verdict."""
    name = pod["metadata"]["name"]
    env.executor.fail_restore[name] = REFUSED
    try:
        kubelet_runs_restore_pod(env, ns, pod, control)
        return verdict(env, ns, name)
    finally:
        env.executor.fail_restore.pop(name, None)


def fallbacks(env: Env, cause: str) -> float:
    value = env.agent_ctx.metrics.registry.get_sample_value("podsnap_agent_restore_fallbacks_total", {"cause": cause})
    return value or 0.0


def test_a_refused_restore_falls_back_to_a_cold_start_and_says_why(env: Env, ns: str, tmp_path: Path) -> None:
    control = tmp_path / "ctl"
    pod = restore_pod_of_policy(env, ns, control)
    name = pod["metadata"]["name"]
    # the webhook wrote the effective policy, and the timeouts the placeholder and startup probe run by
    assert pod["metadata"]["annotations"][c.ANNOTATION_RESTORE_FAILURE_POLICY] == c.RESTORE_FAILURE_COLD_START
    config = env.operator_ctx.config
    got = env_of(pod)
    assert got[c.ENV_RESTORE_FAILURE_POLICY] == c.RESTORE_FAILURE_COLD_START
    assert got[c.ENV_RESTORE_TIMEOUT] == str(config.restore_pickup_timeout_s)
    assert got[c.ENV_RESTORE_MAX] == str(config.restore_max_s)
    before = fallbacks(env, c.REASON_RESTORE_INCOMPATIBLE)

    cond = refused_restore(env, ns, pod, control)
    assert cond["reason"] == c.REASON_FELL_BACK_TO_COLD_START, cond
    assert cond["message"].startswith(f"{c.REASON_RESTORE_INCOMPATIBLE}: gate gpu-model"), cond
    events = wait_for(
        lambda: [
            e
            for e in env.cluster.kube.core.list_namespaced_event(ns).items
            if e.reason == c.REASON_FELL_BACK_TO_COLD_START and e.involved_object.name == name
        ],
        what="a FellBackToColdStart Event",
    )
    assert events[0].type == "Warning" and "gate gpu-model" in events[0].message
    assert fallbacks(env, c.REASON_RESTORE_INCOMPATIBLE) == before + 1
    # the placeholder learns it through the control dir, and starts the worker cold (test_placeholder.py)
    # (the pod's condition and the control-dir file are two writes: the file may follow the condition)
    wait_for((control / c.FILE_RESTORE_FAILED).exists, what="the placeholder told to start cold")
    told = (control / c.FILE_RESTORE_FAILED).read_text()
    assert told.startswith(f"{c.REASON_RESTORE_INCOMPATIBLE}: gate gpu-model")


def test_under_fail_the_pod_keeps_the_cause_and_its_placeholder_is_told_to_hold(
    env: Env, ns: str, tmp_path: Path
) -> None:
    control = tmp_path / "ctl"
    pod = restore_pod_of_policy(env, ns, control, restoreFailurePolicy=c.RESTORE_FAILURE_FAIL)
    assert pod["metadata"]["annotations"][c.ANNOTATION_RESTORE_FAILURE_POLICY] == c.RESTORE_FAILURE_FAIL
    assert env_of(pod)[c.ENV_RESTORE_FAILURE_POLICY] == c.RESTORE_FAILURE_FAIL
    before = fallbacks(env, c.REASON_RESTORE_INCOMPATIBLE)

    cond = refused_restore(env, ns, pod, control)
    assert cond["reason"] == c.REASON_RESTORE_INCOMPATIBLE, cond
    assert "restoreFailurePolicy Fail" in cond["message"], cond
    assert fallbacks(env, c.REASON_RESTORE_INCOMPATIBLE) == before, "no fallback happened"
    # the placeholder must still learn that the restore failed (the file may follow the condition)
    wait_for((control / c.FILE_RESTORE_FAILED).exists, what="the placeholder told that the restore failed")


def test_the_api_server_refuses_an_unknown_restore_failure_policy(env: Env, ns: str) -> None:
    bad = policy("bad", "Deployment", "web", restoreFailurePolicy="Retry")
    with pytest.raises(ApiException) as refused:
        env.cluster.create(c.PLURAL_SNAPSHOT_POLICIES, bad, ns)
    assert refused.value.status == 422 and "restoreFailurePolicy" in str(refused.value.body)
    env.cluster.create(c.PLURAL_SNAPSHOT_POLICIES, policy("good", "Deployment", "web"), ns)
    got = env.cluster.get(c.PLURAL_SNAPSHOT_POLICIES, "good", ns)
    assert got is not None and got["spec"]["restoreFailurePolicy"] == c.RESTORE_FAILURE_COLD_START


POD = {
    "metadata": {"name": "p"},
    "spec": {
        "containers": [{"name": "main", "image": "x", "command": ["serve"], "env": [{"name": "A", "value": "1"}]}]
    },
}


@pytest.mark.parametrize(
    ("own", "policy_says", "effective"),
    [
        (None, c.RESTORE_FAILURE_COLD_START, c.RESTORE_FAILURE_COLD_START),
        (None, c.RESTORE_FAILURE_FAIL, c.RESTORE_FAILURE_FAIL),
        (c.RESTORE_FAILURE_COLD_START, c.RESTORE_FAILURE_FAIL, c.RESTORE_FAILURE_COLD_START),
        (c.RESTORE_FAILURE_FAIL, c.RESTORE_FAILURE_COLD_START, c.RESTORE_FAILURE_FAIL),
        ("Sometimes", c.RESTORE_FAILURE_FAIL, c.RESTORE_FAILURE_FAIL),
    ],
)
def test_a_pods_own_annotation_overrides_its_policy(own: str | None, policy_says: str, effective: str) -> None:
    from podsnap.operator.restore_pod import failure_policy

    pod: dict[str, Any] = {**POD, "metadata": {"name": "p"}}
    if own is not None:
        pod["metadata"] = {"name": "p", "annotations": {c.ANNOTATION_RESTORE_FAILURE_POLICY: own}}
    on_failure = failure_policy(pod, policy_says)
    assert on_failure == effective
    out = shape(pod, snapshot="s", container="main", on_failure=on_failure)
    assert out["metadata"]["annotations"][c.ANNOTATION_RESTORE_FAILURE_POLICY] == effective
    assert env_of(out)[c.ENV_RESTORE_FAILURE_POLICY] == effective


def test_the_container_keeps_its_own_timeouts_and_the_startup_probe_outlasts_them() -> None:
    pod: dict[str, Any] = {
        "metadata": {"name": "p"},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "x",
                    "command": ["serve"],
                    "env": [{"name": c.ENV_RESTORE_TIMEOUT, "value": "30"}],
                }
            ]
        },
    }
    out = shape(pod, snapshot="s", container="main", timeouts=Timeouts(pickup_s=100, restore_s=200))
    got = env_of(out)
    assert (got[c.ENV_RESTORE_TIMEOUT], got[c.ENV_RESTORE_MAX]) == ("30", "200")
    probe = out["spec"]["containers"][0]["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] > 30 + 200
