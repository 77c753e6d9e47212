"""The checkpoint-safe environment, applied by the pod webhook as the real API server calls it: the target
container of a capture pod (SnapshotJob -> Job -> pod, made by the controller manager) and of a restore pod
(a SnapshotPolicy's Deployment) gets the defaults, the engine's own variables and the workload's override,
never over a value the container sets itself; a pod annotated `podsnap.io/checkpoint-env: "off"` gets none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from podsnap import contract as c
from podsnap.operator import safe_env
from podsnap.workload.engines.checkpoint_env import ANNOTATION_ENGINE, COMMON, ENGINE_ENV
from tests.support.operator_env import (
    Env,
    capture_pod,
    deployment,
    golden,
    pod_template,
    policy,
    ready_policy,
    shaped,
    snapshot_job,
)
from tests.support.waiting import wait_for

DEFAULTS = {v.name: v.value for v in COMMON}
VLLM = {v.name: v.value for v in ENGINE_ENV["vllm"]}


def env_of(pod: dict[str, Any], container: str = "main") -> dict[str, Any]:
    [ct] = [ct for ct in pod["spec"]["containers"] if ct["name"] == container]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in ct.get("env") or []}


def test_a_capture_pod_gets_the_env_under_its_own_values_with_its_engines_and_override(env: Env, ns: str) -> None:
    secret = {"secretKeyRef": {"name": "nccl", "key": "ib"}}
    containers = [
        {
            "name": "main",
            "image": "worker:1",
            "command": ["python", "-m", "worker"],
            "env": [
                {"name": "NCCL_SOCKET_IFNAME", "value": "eth0"},  # the workload's own value
                {"name": "NCCL_NVLS_ENABLE", "valueFrom": secret},
            ],
        },
        {"name": "sidecar", "image": "proxy:1", "command": ["proxy"]},
    ]
    job = snapshot_job(
        "cap",
        containers=containers,
        checkpointEnv={"env": {"NCCL_IB_DISABLE": "0", "MY_FLAG": "1"}, "omit": ["HF_HUB_OFFLINE"]},
    )
    job["spec"]["podTemplate"]["metadata"]["annotations"] = {ANNOTATION_ENGINE: "vllm"}
    env.cluster.create(c.PLURAL_SNAPSHOT_JOBS, job, ns)
    got = env_of(capture_pod(env, ns, "cap"))
    assert got["NCCL_SOCKET_IFNAME"] == "eth0" and got["NCCL_NVLS_ENABLE"] == secret, "the container's own win"
    assert (got["NCCL_IB_DISABLE"], got["MY_FLAG"]) == ("0", "1"), "the SnapshotJob's override"
    assert "HF_HUB_OFFLINE" not in got, "omitted by the override"
    assert VLLM.items() <= got.items(), "podsnap.io/engine: vllm adds vLLM's variables"
    mine = ("NCCL_SOCKET_IFNAME", "NCCL_NVLS_ENABLE", "NCCL_IB_DISABLE", "HF_HUB_OFFLINE")
    assert all(got[k] == v for k, v in DEFAULTS.items() if k not in mine), "the other defaults"
    assert not set(DEFAULTS) & set(env_of(capture_pod(env, ns, "cap"), "sidecar")), "only the target container"


def restore_pod(env: Env, ns: str, tmp_path: Path, template: dict[str, Any], **spec: Any) -> dict[str, Any]:
    golden(env, ns)
    env.cluster.kube.apps.create_namespaced_deployment(ns, deployment("web", 0, template))
    env.cluster.create(
        c.PLURAL_SNAPSHOT_POLICIES, policy("pol", "Deployment", "web", checkpointRef={"name": "golden"}, **spec), ns
    )
    ready_policy(env, ns, "pol")
    env.cluster.kube.apps.patch_namespaced_deployment("web", ns, {"spec": {"replicas": 1}})
    [pod] = wait_for(lambda: env.cluster.pods(ns, "app=web"), what="restore pod")
    assert shaped(pod)
    return pod


def test_the_capture_jobs_own_pod_template_carries_the_env_so_a_webhook_outage_cannot_drop_it(
    env: Env, ns: str
) -> None:
    # the pod webhook fails open: a capture pod created while it is down would otherwise be captured bare
    job = snapshot_job("tmpl", checkpointEnv={"env": {"MY_FLAG": "1"}, "omit": ["HF_HUB_OFFLINE"]})
    env.cluster.create(c.PLURAL_SNAPSHOT_JOBS, job, ns)
    name = wait_for(
        lambda: env.cluster.kube.batch.list_namespaced_job(ns, label_selector=f"{c.LABEL_SNAPSHOT_JOB}=tmpl").items,
        what="the capture Job of SnapshotJob tmpl",
    )[0].metadata.name
    template = env.cluster.kube.sanitize(env.cluster.kube.batch.read_namespaced_job(name, ns))["spec"]["template"]
    got = env_of(template)
    assert {k: v for k, v in DEFAULTS.items() if k != "HF_HUB_OFFLINE"}.items() <= got.items()
    assert got["MY_FLAG"] == "1" and "HF_HUB_OFFLINE" not in got, "the SnapshotJob's override, in the template"


def test_a_restore_pod_gets_the_env_under_its_own_values_with_its_policys_override(
    env: Env, ns: str, tmp_path: Path
) -> None:
    template = pod_template("web", tmp_path)
    template["spec"]["containers"][0]["env"].append({"name": "GLOO_SOCKET_IFNAME", "value": "eth1"})
    pod = restore_pod(
        env, ns, tmp_path, template, checkpointEnv={"env": {"NCCL_IB_DISABLE": "0"}, "omit": ["TRANSFORMERS_OFFLINE"]}
    )
    got = env_of(pod)
    assert got["GLOO_SOCKET_IFNAME"] == "eth1", "the container's own value wins"
    assert got["NCCL_IB_DISABLE"] == "0", "the policy's override"
    assert "TRANSFORMERS_OFFLINE" not in got
    rest = {
        k: v for k, v in DEFAULTS.items() if k not in ("GLOO_SOCKET_IFNAME", "NCCL_IB_DISABLE", "TRANSFORMERS_OFFLINE")
    }
    assert rest.items() <= got.items()
    assert not VLLM.keys() & got.keys(), "no engine named: no engine's variables"
    assert got["MODEL"] == "tiny" and c.ENV_CONTROL_DIR in got, "the container's other variables stay"


def test_a_workload_turns_the_env_off_with_its_pod_annotation(env: Env, ns: str, tmp_path: Path) -> None:
    template = pod_template("web", tmp_path)
    template["metadata"]["annotations"] = {c.ANNOTATION_CHECKPOINT_ENV: c.CHECKPOINT_ENV_OFF}
    got = env_of(restore_pod(env, ns, tmp_path, template))
    assert not set(DEFAULTS) & set(got)


def test_the_capture_pod_of_a_policy_gets_the_policys_override(env: Env, ns: str, tmp_path: Path) -> None:
    env.cluster.kube.apps.create_namespaced_deployment(ns, deployment("web", 0, pod_template("web", tmp_path)))
    env.cluster.create(
        c.PLURAL_SNAPSHOT_POLICIES,
        policy("pol", "Deployment", "web", checkpointEnv={"env": {"NCCL_IB_DISABLE": "0"}, "omit": ["HF_HUB_OFFLINE"]}),
        ns,
    )
    [pod] = wait_for(lambda: env.cluster.pods(ns, f"{c.LABEL_POLICY}=pol"), timeout=30, what="the policy's capture pod")
    assert c.ANNOTATION_CAPTURE_TOKEN in pod["metadata"]["annotations"]
    got = env_of(pod)
    assert got["NCCL_IB_DISABLE"] == "0" and "HF_HUB_OFFLINE" not in got
    assert got["NCCL_SOCKET_IFNAME"] == "lo" and got["MODEL"] == "tiny"


# --- the precedence, without a server ------------------------------------------------------------


def test_an_override_can_turn_everything_off_and_a_malformed_one_leaves_the_defaults() -> None:
    pod = {"metadata": {"annotations": {ANNOTATION_ENGINE: "sglang"}}}
    assert safe_env.wanted(DEFAULTS, pod, safe_env.Override()) == DEFAULTS, "sglang adds nothing of its own"
    assert safe_env.wanted(DEFAULTS, pod, safe_env.parse_override({"enabled": False}, "p")) == {}
    assert safe_env.wanted(None, pod, safe_env.Override()) == {}, "workload.checkpointEnv.enabled false"
    unknown = {"metadata": {"annotations": {ANNOTATION_ENGINE: "llama.cpp"}}}
    assert safe_env.wanted(DEFAULTS, unknown, safe_env.Override()) == DEFAULTS, "an unknown engine: the defaults"
    with pytest.raises(safe_env.InvalidOverride, match=r"SnapshotPolicy ns/p: spec.checkpointEnv.env must map"):
        safe_env.parse_override({"env": {"A": 1}}, "SnapshotPolicy ns/p")
    assert safe_env.override_of({"checkpointEnv": {"omit": "HF_HUB_OFFLINE"}}, "p") == safe_env.Override()
