"""Finding 7 (issue 10), the gates the design promised: a restore pod whose container runs another image than
the captured one (by digest, as the kubelet reports it), or has a lower memory limit, is refused with
RestoreIncompatible naming the gate, and its placeholder is told to start cold. Only a SnapshotPolicy's
skipCompatCheck (through the signed restore token) passes them. Real API server and webhook; the kubelet
is played (it reports each image's ID from the image reference: tests/support/harness.py image_id)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from podsnap import contract as c
from tests.support.harness import cond_is, condition, image_id
from tests.support.operator_env import (
    NODE,
    Env,
    capture_token,
    deployment,
    golden,
    kubelet_runs_restore_pod,
    pod_template,
    podsnapshot,
    policy,
    ready_policy,
)
from tests.support.waiting import wait_for

GI = 1 << 30


def restore_pods(env: Env, ns: str, template: dict[str, Any], control: Path, **spec: Any) -> dict[str, Any]:
    """A Deployment restoring `golden` under a policy, scaled to one pod, run by the kubelet; its pod."""
    env.cluster.kube.apps.create_namespaced_deployment(ns, deployment("web", 0, template))
    env.cluster.create(
        c.PLURAL_SNAPSHOT_POLICIES, policy("pol", "Deployment", "web", checkpointRef={"name": "golden"}, **spec), ns
    )
    ready_policy(env, ns, "pol")
    env.cluster.kube.apps.patch_namespaced_deployment("web", ns, {"spec": {"replicas": 1}})
    [pod] = wait_for(lambda: env.cluster.pods(ns, "app=web"), what="restore pod")
    kubelet_runs_restore_pod(env, ns, pod, control)
    return pod


def verdict(env: Env, ns: str, pod: str) -> dict[str, Any]:
    def terminal() -> dict[str, Any] | None:
        cond = condition(env.cluster.pod(ns, pod), c.POD_CONDITION_RESTORED)
        return cond if cond and cond["reason"] != c.REASON_RESTORE_IN_PROGRESS else None

    return wait_for(terminal, what=f"a restore verdict on {pod}")


def test_the_capture_records_image_and_memory_limit(env: Env, ns: str) -> None:
    golden(env, ns)
    snap = env.cluster.get(c.PLURAL_POD_SNAPSHOTS, "golden", ns)
    assert snap is not None
    content = env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, snap["status"]["boundSnapshotContentName"])
    assert content is not None
    assert content["status"]["source"]["imageID"] == image_id("worker:1")
    assert snap["status"]["source"]["imageID"] == image_id("worker:1"), "mirrored onto the PodSnapshot"
    [call] = env.executor.of("capture", "source", ns)
    assert call.request.source_facts == {"imageID": image_id("worker:1")}, "and passed on with the artifact"


def test_a_restore_pod_running_another_image_is_refused(env: Env, ns: str, tmp_path: Path) -> None:
    """The tag `worker:1` was captured; the workload now runs `worker:2` (or the tag moved)."""
    golden(env, ns)
    control = tmp_path / "ctl"
    control.mkdir()
    pod = restore_pods(env, ns, pod_template("web", control, image="worker:2"), control)
    cond = verdict(env, ns, pod["metadata"]["name"])
    # the pod falls back to a cold start (restoreFailurePolicy ColdStart), the gate named as the cause
    assert cond["reason"] == c.REASON_FELL_BACK_TO_COLD_START, cond
    assert cond["message"].startswith(f"{c.REASON_RESTORE_INCOMPATIBLE}: gate image-digest:"), cond
    assert image_id("worker:1") in cond["message"] and image_id("worker:2") in cond["message"]
    assert not env.executor.of("restore", pod["metadata"]["name"], ns)
    # the pod's condition and the control-dir file are two writes: the file may follow the condition
    told = control / c.FILE_RESTORE_FAILED
    wait_for(told.exists, what="the placeholder told to start cold")
    assert told.read_text().startswith(c.REASON_RESTORE_INCOMPATIBLE), "start cold"


def limited_source(env: Env, ns: str, limit: str) -> None:
    """A capture source (marked as a SnapshotJob's pod is) with a memory limit, captured as `golden`."""
    env.cluster.kube.core.create_namespaced_pod(
        ns,
        {
            "metadata": {
                "name": "source",
                "annotations": {c.ANNOTATION_CAPTURE_TOKEN: capture_token(env, ns, job="golden")},
            },
            "spec": {"containers": [{"name": "main", "image": "worker:1", "resources": {"limits": {"memory": limit}}}]},
        },
    )
    env.cluster.kubelet_bind(ns, "source", NODE)
    proc = env.cluster.kubelet_container()
    env.cluster.kubelet_run(ns, "source", ready=True, container_ids={"main": proc.container_id})
    env.cluster.create(c.PLURAL_POD_SNAPSHOTS, podsnapshot("golden", "source"), ns)
    wait_for(lambda: cond_is(env.cluster.get(c.PLURAL_POD_SNAPSHOTS, "golden", ns), c.COND_READY), what="golden")


def with_limit(template: dict[str, Any], limit: str) -> dict[str, Any]:
    template["spec"]["containers"][0]["resources"] = {"limits": {"memory": limit}}
    return template


def test_a_restore_pod_with_a_lower_memory_limit_is_refused(env: Env, ns: str, tmp_path: Path) -> None:
    limited_source(env, ns, "2Gi")
    control = tmp_path / "ctl"
    control.mkdir()
    pod = restore_pods(env, ns, with_limit(pod_template("web", control), "1Gi"), control)
    cond = verdict(env, ns, pod["metadata"]["name"])
    # the pod falls back to a cold start (restoreFailurePolicy ColdStart), the gate named as the cause
    assert cond["reason"] == c.REASON_FELL_BACK_TO_COLD_START, cond
    assert cond["message"].startswith(f"{c.REASON_RESTORE_INCOMPATIBLE}: gate memory-limit:"), cond
    assert f"{GI} bytes, the source had {2 * GI}" in cond["message"]
    assert not env.executor.of("restore", pod["metadata"]["name"], ns)


def test_a_restore_pod_with_as_much_memory_restores_and_the_engine_gets_its_limit(
    env: Env, ns: str, tmp_path: Path
) -> None:
    limited_source(env, ns, "2Gi")
    control = tmp_path / "ctl"
    control.mkdir()
    pod = restore_pods(env, ns, with_limit(pod_template("web", control), "4Gi"), control)
    assert verdict(env, ns, pod["metadata"]["name"])["reason"] == c.REASON_RESTORE_SUCCEEDED
    [call] = env.executor.of("restore", pod["metadata"]["name"], ns)
    assert call.request.memory_limit_bytes == 4 * GI and call.request.skip_compat is False


def test_the_policys_skip_compat_check_passes_the_soft_gates(env: Env, ns: str, tmp_path: Path) -> None:
    golden(env, ns)
    control = tmp_path / "ctl"
    control.mkdir()
    pod = restore_pods(env, ns, pod_template("web", control, image="worker:2"), control, skipCompatCheck=True)
    assert verdict(env, ns, pod["metadata"]["name"])["reason"] == c.REASON_RESTORE_SUCCEEDED
    [call] = env.executor.of("restore", pod["metadata"]["name"], ns)
    assert call.request.skip_compat is True
