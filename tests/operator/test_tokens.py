"""Finding 4 (issue 10), what may be captured and restored, and finding 7's skip-compat-check: the agent acts only
on pods podsnap made, proven by HMAC tokens a namespace user cannot forge. Each test performs the attack
against the real API server (RBAC on) and the running operator and agent, and sees it refused with the
reason a user reads (condition + Event)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from podsnap import contract as c
from podsnap.kube.tokens import CAPTURE, Claims, TokenKey
from podsnap.operator.restore_pod import shape
from tests.support.harness import condition
from tests.support.operator_env import (
    NODE,
    Env,
    capture_pod,
    capture_token,
    deployment,
    failed_with,
    golden,
    kubelet_runs_restore_pod,
    pod_template,
    podsnapshot,
    policy,
    ready_policy,
    restore_token,
    running_pod,
    snapshot_job,
)
from tests.support.waiting import wait_for


def events(env: Env, ns: str, reason: str, name: str | None = None) -> list[Any]:
    return [
        e
        for e in env.cluster.kube.core.list_namespaced_event(ns).items
        if e.reason == reason and (name is None or e.involved_object.name == name)
    ]


def content_of(env: Env, ns: str, snapshot: str) -> dict[str, Any] | None:
    snap = env.cluster.get(c.PLURAL_POD_SNAPSHOTS, snapshot, ns)
    assert snap is not None
    return env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, c.content_name(snap["metadata"]["uid"]))


# --- capture ------------------------------------------------------------------------------------------


def test_a_podsnapshot_of_a_pod_no_snapshotjob_made_is_refused(env: Env, ns: str) -> None:
    """The attack: a PodSnapshot written by hand that points at any Ready pod of the namespace (its processes
    would end, its memory would be copied)."""
    running_pod(env, ns, "db", token=None)
    env.cluster.create(c.PLURAL_POD_SNAPSHOTS, podsnapshot("steal", "db"), ns)
    snap = failed_with(env, ns, "steal", c.REASON_NOT_A_CAPTURE_SOURCE)
    message = condition(snap, c.COND_FAILED)["message"]  # type: ignore[index]
    assert f"pod {ns}/db is not a capture source" in message and "SnapshotJob" in message
    assert wait_for(lambda: events(env, ns, c.REASON_NOT_A_CAPTURE_SOURCE, "steal"), what="a Warning Event")
    assert content_of(env, ns, "steal") is None, "no work order reaches any agent"
    assert not env.executor.of("capture", "db", ns)


def test_labels_and_a_forged_or_foreign_token_do_not_make_a_capture_source(env: Env, ns: str) -> None:
    """Everything a namespace user can write on a pod: the capture-source labels, a token made with another
    key, and a real token copied from another namespace's capture pod."""
    other = env.cluster.namespace(f"{ns}-other"[:63])
    forged = TokenKey(b"guessed-key-guessed-key-guessed!").mint(Claims(CAPTURE, ns, "main", "x"))
    cases = {
        "forged": (forged, "not signed with this installation's key"),
        "foreign": (capture_token(env, other), f"issued in namespace {other}"),
    }
    for name, (token, why) in cases.items():
        running_pod(env, ns, name, token=token)
        env.cluster.kube.core.patch_namespaced_pod(
            name, ns, {"metadata": {"labels": {c.LABEL_CHECKPOINT_SOURCE: "true", c.LABEL_SNAPSHOT_JOB: "x"}}}
        )
        env.cluster.create(c.PLURAL_POD_SNAPSHOTS, podsnapshot(f"s-{name}", name), ns)
        snap = failed_with(env, ns, f"s-{name}", c.REASON_NOT_A_CAPTURE_SOURCE)
        assert why in condition(snap, c.COND_FAILED)["message"], snap  # type: ignore[index]
        assert not env.executor.of("capture", name, ns)


def test_a_capture_token_copied_onto_another_pod_is_refused(env: Env, ns: str) -> None:
    """Finding 10, the attack: the capture token of a SnapshotJob's pod (readable by anyone who can read the
    pod) copied onto another pod of the namespace, then a PodSnapshot written by hand for that pod. The token
    names its SnapshotJob, whose PodSnapshot carries its name; no other PodSnapshot may use it. The agent
    checks the same on its own (a content written by hand, with the operator's check skipped)."""
    env.cluster.create(c.PLURAL_SNAPSHOT_JOBS, snapshot_job("cap"), ns)
    copied = capture_pod(env, ns, "cap")["metadata"]["annotations"][c.ANNOTATION_CAPTURE_TOKEN]
    assert env.operator_ctx.tokens.verify(copied) == Claims(CAPTURE, ns, "main", "cap")
    pod, _ = running_pod(env, ns, "db", token=copied)
    env.cluster.create(c.PLURAL_POD_SNAPSHOTS, podsnapshot("steal", "db"), ns)
    snap = failed_with(env, ns, "steal", c.REASON_NOT_A_CAPTURE_SOURCE)
    assert "it is for 'cap', not 'steal'" in condition(snap, c.COND_FAILED)["message"], snap  # type: ignore[index]
    assert wait_for(lambda: events(env, ns, c.REASON_NOT_A_CAPTURE_SOURCE, "steal"), what="a Warning Event")
    assert content_of(env, ns, "steal") is None, "no work order reaches any agent"

    name = f"{c.CONTENT_NAME_PREFIX}{ns}-copied"[:63]
    env.cluster.create(c.PLURAL_POD_SNAPSHOT_CONTENTS, handmade_content(name, ns, "steal", pod))
    try:
        failed = wait_for(
            lambda: condition(env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, name), c.COND_FAILED),
            what="the agent's verdict",
        )
        assert failed["reason"] == c.REASON_NOT_A_CAPTURE_SOURCE and "it is for 'cap', not 'steal'" in failed["message"]
        assert not env.executor.of("capture", "db", ns)
    finally:
        env.cluster.kube.delete_cr(c.PLURAL_POD_SNAPSHOT_CONTENTS, name)


def handmade_content(name: str, ns: str, snapshot: str, pod: dict[str, Any]) -> dict[str, Any]:
    """A work order for node-a's agent written by hand (someone with rights on the cluster-scoped contents)."""
    return {
        "kind": c.KIND_POD_SNAPSHOT_CONTENT,
        "metadata": {"name": name, "labels": {c.LABEL_SNAPSHOT_NODE: NODE}},
        "spec": {
            "podSnapshotRef": {"namespace": ns, "name": snapshot, "uid": "0"},
            "source": {
                "podRef": {
                    "namespace": ns,
                    "name": pod["metadata"]["name"],
                    "uid": pod["metadata"]["uid"],
                    "containers": ["main"],
                }
            },
            "nodeName": NODE,
            "artifactPath": f"{ns}/{snapshot}",
        },
    }


def test_the_agent_itself_refuses_a_work_order_for_an_unmarked_pod(env: Env, ns: str) -> None:
    """Should a content reach the agent without the operator's check (written by someone with rights on the
    cluster-scoped contents), the agent checks the source pod's token on its own."""
    pod, _ = running_pod(env, ns, "db", token=None)
    name = f"{c.CONTENT_NAME_PREFIX}{ns}-handmade"[:63]
    env.cluster.create(
        c.PLURAL_POD_SNAPSHOT_CONTENTS,
        {
            "kind": c.KIND_POD_SNAPSHOT_CONTENT,
            "metadata": {"name": name, "labels": {c.LABEL_SNAPSHOT_NODE: NODE}},
            "spec": {
                "podSnapshotRef": {"namespace": ns, "name": "handmade", "uid": "0"},
                "source": {
                    "podRef": {"namespace": ns, "name": "db", "uid": pod["metadata"]["uid"], "containers": ["main"]}
                },
                "nodeName": NODE,
                "artifactPath": f"{ns}/handmade",
            },
        },
    )
    try:
        failed = wait_for(
            lambda: condition(env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, name), c.COND_FAILED),
            what="the agent's verdict",
        )
        assert failed["reason"] == c.REASON_NOT_A_CAPTURE_SOURCE and c.ANNOTATION_CAPTURE_TOKEN in failed["message"]
        assert not env.executor.of("capture", "db", ns)
    finally:
        env.cluster.kube.delete_cr(c.PLURAL_POD_SNAPSHOT_CONTENTS, name)


def test_a_snapshotjob_pod_carries_the_token_the_agent_accepts(env: Env, ns: str) -> None:
    """The operator's side: the capture Job's pod template is marked for its namespace and target container."""
    from tests.support.operator_env import kubelet_starts_capture_pod, snapshot_job

    env.cluster.create(c.PLURAL_SNAPSHOT_JOBS, snapshot_job("cap"), ns)
    pod, _ = kubelet_starts_capture_pod(env, ns, "cap")
    claims = env.operator_ctx.tokens.verify(pod["metadata"]["annotations"][c.ANNOTATION_CAPTURE_TOKEN])
    assert claims == Claims(CAPTURE, ns, "main", "cap")
    wait_for(lambda: env.executor.of("capture", pod["metadata"]["name"], ns), what="the capture")


# --- restore ------------------------------------------------------------------------------------------


def handmade_restore_pod(
    env: Env, ns: str, name: str, snapshot: str, control: Path, *, token: str | None
) -> dict[str, Any]:
    """A pod its author shaped like a restore pod (restore label, restore-from annotation, placeholder)."""
    control.mkdir(parents=True, exist_ok=True)
    pod = shape(
        {
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
        },
        snapshot=snapshot,
        container="main",
    )
    if token is not None:
        pod["metadata"]["annotations"][c.ANNOTATION_RESTORE_TOKEN] = token
    pod["metadata"]["annotations"][c.ANNOTATION_SKIP_COMPAT_CHECK] = "true"
    obj = env.cluster.kube.sanitize(env.cluster.kube.core.create_namespaced_pod(ns, pod))
    kubelet_runs_restore_pod(env, ns, obj, control)
    return obj


def refused(env: Env, ns: str, pod: str) -> dict[str, Any]:
    return wait_for(
        lambda: (
            (cond := condition(env.cluster.pod(ns, pod), c.POD_CONDITION_RESTORED))
            and cond["reason"] == c.REASON_RESTORE_REFUSED
            and cond
        ),
        what=f"RestoreRefused on {pod}",
    )


def test_a_handmade_restore_pod_is_refused(env: Env, ns: str, tmp_path: Path) -> None:
    golden(env, ns)
    handmade_restore_pod(env, ns, "r", "golden", tmp_path / "ctl", token=None)
    cond = refused(env, ns, "r")
    assert f"pod {ns}/r was not shaped for restore by podsnap" in cond["message"]
    assert wait_for(lambda: events(env, ns, c.REASON_RESTORE_REFUSED, "r"), what="a Warning Event")
    assert not env.executor.of("restore", "r", ns), "nothing is restored into it"
    assert not (tmp_path / "ctl" / c.FILE_RESTORE_COMPLETE).exists()


def test_a_restore_token_copied_from_another_namespace_is_refused(env: Env, ns: str, tmp_path: Path) -> None:
    """The token of a pod shaped in namespace A, on a pod in B that restores B's snapshot of the same name."""
    golden(env, ns)
    other = f"{ns}-a"[:63]
    handmade_restore_pod(env, ns, "r", "golden", tmp_path / "ctl", token=restore_token(env, other, "golden"))
    assert f"issued in namespace {other}, not {ns}" in refused(env, ns, "r")["message"]
    assert not env.executor.of("restore", "r", ns)


def test_a_restore_token_for_another_snapshot_or_container_is_refused(env: Env, ns: str, tmp_path: Path) -> None:
    golden(env, ns)
    handmade_restore_pod(env, ns, "r1", "golden", tmp_path / "c1", token=restore_token(env, ns, "older"))
    assert "it is for 'older', not 'golden'" in refused(env, ns, "r1")["message"]
    handmade_restore_pod(env, ns, "r2", "golden", tmp_path / "c2", token=restore_token(env, ns, "golden", "sidecar"))
    assert "for container 'sidecar', not 'main'" in refused(env, ns, "r2")["message"]
    assert not env.executor.of("restore", "r1", ns) and not env.executor.of("restore", "r2", ns)


def test_a_restore_token_copied_within_its_namespace_restores(env: Env, ns: str, tmp_path: Path) -> None:
    """Documented (docs/security.md): within one namespace a copied token gains nothing, since placing it takes
    rights on pods that already give everything a restore could. The pod's skip annotation still counts for
    nothing: the token says no."""
    golden(env, ns)
    handmade_restore_pod(env, ns, "r", "golden", tmp_path / "ctl", token=restore_token(env, ns, "golden"))
    [call] = wait_for(lambda: env.executor.of("restore", "r", ns), what="the restore")
    assert call.request.skip_compat is False


def test_only_the_policy_skips_the_soft_gates(env: Env, ns: str, tmp_path: Path) -> None:
    """Finding 7: `podsnap.io/skip-compat-check` written by the pod's author is ignored (tests/operator/
    test_webhook.py); a SnapshotPolicy's skipCompatCheck reaches the agent through the signed token."""
    golden(env, ns)
    control = tmp_path / "ctl"
    control.mkdir()
    env.cluster.kube.apps.create_namespaced_deployment(ns, deployment("web", 0, pod_template("web", control)))
    env.cluster.create(
        c.PLURAL_SNAPSHOT_POLICIES,
        policy("pol", "Deployment", "web", checkpointRef={"name": "golden"}, skipCompatCheck=True),
        ns,
    )
    ready_policy(env, ns, "pol")
    env.cluster.kube.apps.patch_namespaced_deployment("web", ns, {"spec": {"replicas": 1}})
    [pod] = wait_for(lambda: env.cluster.pods(ns, "app=web"), what="restore pod")
    annotations = pod["metadata"]["annotations"]
    assert annotations[c.ANNOTATION_SKIP_COMPAT_CHECK] == "true"
    assert env.operator_ctx.tokens.verify(annotations[c.ANNOTATION_RESTORE_TOKEN]).skip_compat is True
    kubelet_runs_restore_pod(env, ns, pod, control)
    [call] = wait_for(lambda: env.executor.of("restore", pod["metadata"]["name"], ns), what="the restore")
    assert call.request.skip_compat is True
