"""The agent takes the artifact of a restore from the PodSnapshotContent bound to the pod's PodSnapshot, and
from nothing a namespace user can write: not the PodSnapshot's status, not a content bound elsewhere."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from podsnap import contract as c
from podsnap.agent.executor import ExecutionError
from podsnap.kube.conditions import MESSAGE_MAX
from podsnap.operator.restore_pod import shape
from tests.support.harness import cgroups_writable, cond_is, condition
from tests.support.operator_env import (
    OTHER_NODE,
    Env,
    get_snap,
    golden,
    kubelet_runs_restore_pod,
    podsnapshot,
    restore_token,
    running_pod,
)
from tests.support.waiting import wait_for

pytestmark = pytest.mark.skipif(cgroups_writable() is not None, reason=str(cgroups_writable()))


def restore_pod(env: Env, ns: str, name: str, snapshot: str, control: Path) -> dict[str, Any]:
    """A pod shaped for restore (what the webhook makes of a policy's pod), run by the kubelet on NODE."""
    control.mkdir(parents=True, exist_ok=True)
    pod = {
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "worker:1",
                    "command": ["python", "-m", "worker"],
                    "env": [{"name": c.ENV_CONTROL_DIR, "value": str(control)}],
                }
            ]
        },
    }
    shaped = shape(pod, snapshot=snapshot, container="main")
    shaped["metadata"]["annotations"][c.ANNOTATION_RESTORE_TOKEN] = restore_token(env, ns, snapshot)
    created = env.cluster.kube.core.create_namespaced_pod(ns, shaped)
    obj = env.cluster.kube.sanitize(created)
    kubelet_runs_restore_pod(env, ns, obj, control)
    return obj


def restored(env: Env, ns: str, pod: str) -> dict[str, Any]:
    """The pod's terminal Restored condition."""

    def verdict() -> dict[str, Any] | None:
        cond = condition(env.cluster.pod(ns, pod), c.POD_CONDITION_RESTORED)
        return cond if cond and cond["reason"] != c.REASON_RESTORE_IN_PROGRESS else None

    return wait_for(verdict, what=f"a restore verdict on {pod}")


def fell_back(verdict: dict[str, Any], cause: str) -> bool:
    """The pod fell back to a cold start (the default restoreFailurePolicy) because of `cause`."""
    return bool(verdict["reason"] == c.REASON_FELL_BACK_TO_COLD_START and verdict["message"].startswith(f"{cause}: "))


def write_status(env: Env, ns: str, name: str, status: dict[str, Any]) -> None:
    """What a namespace user with write access to PodSnapshot status can do."""
    env.cluster.kube.custom.patch_namespaced_custom_object_status(
        c.GROUP, c.VERSION, ns, c.PLURAL_POD_SNAPSHOTS, name, {"status": status}
    )


READY = {"type": c.COND_READY, "status": "True", "reason": "Forged", "message": "forged", "lastTransitionTime": "2026-12-01T00:00:00Z"}  # fmt: skip


def test_restore_uses_the_bound_contents_artifact_whatever_the_snapshot_status_says(
    env: Env, ns: str, tmp_path: Path
) -> None:
    golden(env, ns)
    snap = get_snap(env, ns, "golden")
    assert snap is not None
    content = env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, c.content_name(snap["metadata"]["uid"]))
    assert content is not None
    # someone rewrites the snapshot's status to point at another namespace's artifact
    write_status(env, ns, "golden", {"artifact": {"path": "other-ns/secret-uid", "digest": "sha256:" + "0" * 64}})
    restore_pod(env, ns, "r", "golden", tmp_path / "ctl")
    assert restored(env, ns, "r")["reason"] == c.REASON_RESTORE_SUCCEEDED
    [call] = env.executor.of("restore", "r", ns)
    assert call.request.artifact_dir == (env.artifact_root / content["spec"]["artifactPath"]).resolve()
    assert call.request.expected_digest == content["status"]["artifact"]["digest"]


def test_a_content_bound_to_another_snapshot_is_refused(env: Env, ns: str, tmp_path: Path) -> None:
    golden(env, ns)
    source = get_snap(env, ns, "golden")
    assert source is not None
    # a snapshot of nothing: the operator fails it and binds no content
    forged = env.cluster.create(c.PLURAL_POD_SNAPSHOTS, podsnapshot("forged", "nobody"), ns)
    wait_for(lambda: cond_is(get_snap(env, ns, "forged"), c.COND_FAILED), what="forged Failed")
    # a content under the forged snapshot's name that is bound to the golden snapshot (and its artifact)
    golden_content = env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, c.content_name(source["metadata"]["uid"]))
    assert golden_content is not None
    name = c.content_name(forged["metadata"]["uid"])
    env.cluster.create(
        c.PLURAL_POD_SNAPSHOT_CONTENTS,
        {"kind": c.KIND_POD_SNAPSHOT_CONTENT, "metadata": {"name": name}, "spec": golden_content["spec"]},
    )
    env.cluster.kube.custom.patch_cluster_custom_object_status(
        c.GROUP, c.VERSION, c.PLURAL_POD_SNAPSHOT_CONTENTS, name, {"status": golden_content["status"]}
    )
    write_status(env, ns, "forged", {"conditions": [READY]})
    try:
        restore_pod(env, ns, "r", "forged", tmp_path / "ctl")
        verdict = restored(env, ns, "r")
        assert fell_back(verdict, c.REASON_RESTORE_FAILED)
        assert f"bound to PodSnapshot {ns}/golden" in verdict["message"], verdict["message"]
        assert not env.executor.of("restore", "r", ns), "nothing is restored from another snapshot's artifact"
        assert not (tmp_path / "ctl" / c.FILE_RESTORE_COMPLETE).exists()
    finally:
        env.cluster.kube.delete_cr(c.PLURAL_POD_SNAPSHOT_CONTENTS, name)


def test_a_snapshot_its_user_marked_ready_restores_nothing_before_its_content_is_ready(
    env: Env, ns: str, tmp_path: Path
) -> None:
    running_pod(env, ns, "p", node=OTHER_NODE)  # node-b's agent is not running: its content stays Pending
    snap = env.cluster.create(c.PLURAL_POD_SNAPSHOTS, podsnapshot("s", "p"), ns)
    wait_for(
        lambda: env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, c.content_name(snap["metadata"]["uid"])), what="content"
    )
    write_status(env, ns, "s", {"conditions": [READY]})
    restore_pod(env, ns, "r", "s", tmp_path / "ctl")
    verdict = restored(env, ns, "r")
    assert fell_back(verdict, c.REASON_RESTORE_FAILED) and "is not Ready" in verdict["message"], verdict
    assert not env.executor.of("restore", "r", ns)


def test_a_manifest_changed_after_its_capture_fails_the_restore(env: Env, ns: str, tmp_path: Path) -> None:
    golden(env, ns)
    snap = get_snap(env, ns, "golden")
    assert snap is not None
    content = env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, c.content_name(snap["metadata"]["uid"]))
    assert content is not None
    manifest = env.artifact_root / content["spec"]["artifactPath"] / "manifest.json"
    manifest.write_text(manifest.read_text() + " ")
    restore_pod(env, ns, "r", "golden", tmp_path / "ctl")
    verdict = restored(env, ns, "r")
    assert fell_back(verdict, c.REASON_RESTORE_FAILED) and "changed after its capture" in verdict["message"]


def test_failure_messages_are_one_line_that_says_where_the_log_is(env: Env, ns: str, tmp_path: Path) -> None:
    """Condition messages and Events carry the cause and where to look, never CRIU's log itself."""
    golden(env, ns)
    tail = "\n".join(f"(00.{i:06d}) Error (criu/cr-restore.c:{i}): something went wrong" for i in range(40))
    log = "/var/lib/podsnap/artifacts/.logs/node-a/podsnap-restore-x/restore.log"
    env.executor.fail_restore["r"] = ExecutionError(
        f"restore failed during criu_restore: criu restore exited with 1: {'no memory ' * 60}(full log: {log})\n"
        f"--- CRIU log (tail) ---\n{tail}",
        reason=c.REASON_RESTORE_FAILED,
    )
    try:
        restore_pod(env, ns, "r", "golden", tmp_path / "ctl")
        verdict = restored(env, ns, "r")
    finally:
        env.executor.fail_restore.pop("r", None)
    message = verdict["message"]
    assert fell_back(verdict, c.REASON_RESTORE_FAILED)
    assert "\n" not in message and len(message) <= MESSAGE_MAX, message
    assert message.startswith("RestoreFailed: restore failed during criu_restore") and message.endswith(
        f"(full log: {log})"
    )
    events = wait_for(
        lambda: [
            e
            for e in env.cluster.kube.core.list_namespaced_event(ns).items
            if e.reason == c.REASON_FELL_BACK_TO_COLD_START
        ],
        what="a FellBackToColdStart Event",
    )
    assert "\n" not in events[0].message and f"(full log: {log})" in events[0].message
    # the placeholder was told, in one line too (the agent writes the file just after the condition)
    told_file = tmp_path / "ctl" / c.FILE_RESTORE_FAILED
    wait_for(told_file.exists, what=f"{told_file} written")
    told = told_file.read_text()
    assert told.count("\n") == 1 and told.startswith(f"{c.REASON_RESTORE_FAILED}: restore failed")
