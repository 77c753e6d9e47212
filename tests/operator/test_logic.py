"""Pure logic of the operator and agent: no API server (the state machines' every branch, shaping, hashes)."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest

from podsnap import contract as c
from podsnap.agent import control
from podsnap.agent.executor import ExecutionError
from podsnap.agent.on_content import artifact_dir
from podsnap.kube import conditions
from podsnap.kube.conditions import Condition
from podsnap.operator import capture_job, capture_seccomp, placeholder, policy, restore_pod
from podsnap.operator.on_podsnapshot import mirror

NOW = datetime.datetime(2026, 11, 30, 13, 0, 0, tzinfo=datetime.UTC)
STARTED = "2026-11-30T12:59:00Z"


def template(*names: str) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": n, "image": "img"} for n in names or ("main",)]}}


# --- SnapshotJob spec and Job shape -------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({}, "spec.podTemplate"),
        ({"podTemplate": template("main"), "podSnapshotTemplate": {"targetContainers": ["a", "b"]}}, "exactly one"),
        ({"podTemplate": template("main"), "podSnapshotTemplate": {"targetContainers": ["nope"]}}, "'nope' is not in"),
        ({"podTemplate": template("worker")}, "'main' is not in"),
        ({"podTemplate": template("main"), "activeDeadlineSeconds": 0}, "activeDeadlineSeconds"),
    ],
)
def test_invalid_snapshot_job_specs_name_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(capture_job.InvalidSpec, match=field):
        capture_job.parse_spec(spec)


def test_job_clears_probes_only_on_the_target_and_keeps_other_containers() -> None:
    tpl = template("main", "sidecar")
    for ct in tpl["spec"]["containers"]:
        ct["livenessProbe"] = {"exec": {"command": ["true"]}}
    spec = capture_job.parse_spec({"podTemplate": tpl})
    job = capture_job.build_job(name="j", namespace="n", uid="u", spec=spec, seccomp_profile=None)
    main, side = job["spec"]["template"]["spec"]["containers"]
    assert "livenessProbe" not in main and "livenessProbe" in side
    assert "env" not in side and "readinessProbe" not in side
    assert "securityContext" not in job["spec"]["template"]["spec"]  # no profile configured: none forced
    assert spec.pod_template == tpl  # the input is not mutated


OURS = "podsnap/capture-v2.json"


def shaped_security(tpl: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    spec = capture_job.parse_spec({"podTemplate": tpl})
    pod = capture_job.build_job(name="j", namespace="n", uid="u", spec=spec, seccomp_profile=OURS)["spec"]["template"]
    per_container = {
        ct["name"]: (ct.get("securityContext") or {}).get("seccompProfile") for ct in pod["spec"]["containers"]
    }
    return pod["spec"]["securityContext"]["seccompProfile"], per_container


@pytest.mark.parametrize("pod_profile", [None, {"type": "RuntimeDefault"}, {"type": "Unconfined"}])
def test_podsnaps_profile_replaces_runtime_default_unconfined_or_none_at_pod_and_container_level(
    pod_profile: dict[str, Any] | None,
) -> None:
    """RuntimeDefault is no stricter than podsnap's profile (the runtime default minus io_uring), so it is
    replaced; so is a container's own RuntimeDefault/Unconfined, which would override the pod's."""
    tpl = template("main", "sidecar", "plain")
    if pod_profile:
        tpl["spec"]["securityContext"] = {"seccompProfile": pod_profile, "runAsNonRoot": True}
    tpl["spec"]["containers"][0]["securityContext"] = {"seccompProfile": {"type": "RuntimeDefault"}}
    tpl["spec"]["containers"][1]["securityContext"] = {"seccompProfile": {"type": "Unconfined"}}
    pod_level, per_container = shaped_security(tpl)
    ours = {"type": "Localhost", "localhostProfile": OURS}
    assert pod_level == ours
    assert per_container == {"main": ours, "sidecar": ours, "plain": None}  # "plain" inherits the pod's
    assert capture_seccomp.kept(tpl, OURS) == []


def test_a_localhost_profile_of_the_template_is_kept_and_reported() -> None:
    """A user's Localhost profile may be stricter than podsnap's: podsnap must not weaken it."""
    tpl = template("main", "sidecar")
    tpl["spec"]["securityContext"] = {"seccompProfile": {"type": "Localhost", "localhostProfile": "team/strict.json"}}
    tpl["spec"]["containers"][1]["securityContext"] = {
        "seccompProfile": {"type": "Localhost", "localhostProfile": "team/sidecar.json"}
    }
    pod_level, per_container = shaped_security(tpl)
    assert pod_level == {"type": "Localhost", "localhostProfile": "team/strict.json"}
    assert per_container == {"main": None, "sidecar": {"type": "Localhost", "localhostProfile": "team/sidecar.json"}}
    assert capture_seccomp.kept(tpl, OURS) == [
        "pod (team/strict.json)",
        "container sidecar (team/sidecar.json)",
    ]
    # naming podsnap's own profile is not "keeping another one"
    tpl["spec"]["securityContext"]["seccompProfile"]["localhostProfile"] = OURS
    assert capture_seccomp.kept(tpl, OURS) == ["container sidecar (team/sidecar.json)"]


def test_the_deprecated_seccomp_annotations_count_as_the_templates_profile() -> None:
    """Kubernetes before 1.27 still reads them, and rejects a pod whose field and annotation differ: podsnap
    replaces an annotated RuntimeDefault (dropping the annotation) and keeps an annotated Localhost."""
    tpl = template("main", "sidecar")
    tpl["metadata"] = {
        "annotations": {
            capture_seccomp.POD_ANNOTATION: "runtime/default",
            capture_seccomp.CONTAINER_ANNOTATION_PREFIX + "sidecar": "localhost/team/sidecar.json",
            "team.example/owner": "ml",
        }
    }
    spec = capture_job.parse_spec({"podTemplate": tpl})
    shaped = capture_job.build_job(name="j", namespace="n", uid="u", spec=spec, seccomp_profile=OURS)["spec"][
        "template"
    ]
    annotations = shaped["metadata"]["annotations"]
    assert capture_seccomp.POD_ANNOTATION not in annotations, "it would contradict the field: the pod is refused"
    assert annotations[capture_seccomp.CONTAINER_ANNOTATION_PREFIX + "sidecar"] == "localhost/team/sidecar.json"
    assert annotations["team.example/owner"] == "ml"
    assert shaped["spec"]["securityContext"]["seccompProfile"] == {"type": "Localhost", "localhostProfile": OURS}
    _, sidecar = shaped["spec"]["containers"]
    assert "securityContext" not in sidecar, "the annotated Localhost profile stays the sidecar's"
    assert capture_seccomp.kept(tpl, OURS) == ["container sidecar (team/sidecar.json)"]


def test_long_names_give_valid_job_names() -> None:
    name = capture_job.job_name("x" * 200)
    assert len(name) <= 52 and name != capture_job.job_name("x" * 199)


# --- SnapshotJob state machine ------------------------------------------------------------------


def pod(*, ready: bool = True, phase: str = "Running", node: str | None = "n1") -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "uid": "pu"},
        "spec": {"nodeName": node},
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def snap(cond: str | None) -> dict[str, Any]:
    conds = [] if cond is None else [{"type": cond, "status": "True", "reason": "R", "message": "m"}]
    return {"metadata": {"name": "s", "uid": "su"}, "status": {"conditions": conds}}


def job(cond: str | None = None, reason: str = "") -> dict[str, Any]:
    return {"status": {"conditions": [{"type": cond, "status": "True", "reason": reason}] if cond else []}}


def decide(**kw: Any) -> capture_job.Step:
    args: dict[str, Any] = {
        "status": {"startedAt": STARTED},
        "deadline_s": 3600,
        "now": NOW,
        "job": job(),
        "pod": None,
        "snapshot": None,
    }
    args.update(kw)
    return capture_job.decide(**args)


def reasons(step: capture_job.Step) -> dict[str, tuple[bool, str]]:
    return {u.type: (u.status, u.reason) for u in step.conditions}


def test_state_pod_pending() -> None:
    assert reasons(decide(pod=pod(ready=False))) == {c.COND_RUNNING: (True, c.REASON_POD_PENDING)}
    assert reasons(decide(pod=pod(node=None))) == {c.COND_RUNNING: (True, c.REASON_POD_PENDING)}


def test_state_pod_ready_creates_the_snapshot() -> None:
    step = decide(pod=pod())
    assert reasons(step) == {c.COND_RUNNING: (True, c.REASON_POD_READY)}
    assert step.create_snapshot_for is not None


def test_state_capture_in_progress_records_the_snapshot() -> None:
    step = decide(pod=pod(), snapshot=snap(None))
    assert reasons(step) == {c.COND_RUNNING: (True, c.REASON_CAPTURE_IN_PROGRESS)}
    assert step.status == {"podSnapshotName": "s", "podSnapshotUID": "su"}


def test_state_captured_then_completed_when_the_job_is_gone() -> None:
    step = decide(pod=pod(), snapshot=snap(c.COND_READY))
    assert reasons(step) == {c.COND_CAPTURED: (True, c.REASON_CAPTURE_COMPLETED)} and step.delete_job
    done = decide(job=None, snapshot=snap(c.COND_READY))
    assert done.terminal and reasons(done)[c.COND_COMPLETED] == (True, c.REASON_JOB_COMPLETED)
    assert reasons(decide(job=job("Failed", "BackoffLimitExceeded"), snapshot=snap(c.COND_READY)))[c.COND_COMPLETED][0]


def test_state_capture_failed() -> None:
    step = decide(pod=pod(), snapshot=snap(c.COND_FAILED))
    assert reasons(step)[c.COND_FAILED] == (True, c.REASON_CAPTURE_FAILED) and step.terminal and step.delete_job


def test_state_deadline_from_start_time_and_from_the_job() -> None:
    late = decide(pod=pod(ready=False), deadline_s=30)
    assert reasons(late)[c.COND_FAILED] == (True, c.REASON_DEADLINE_EXCEEDED)
    assert reasons(decide(job=job("Failed", "DeadlineExceeded")))[c.COND_FAILED] == (True, c.REASON_DEADLINE_EXCEEDED)
    # a capture that finished is not undone by the deadline passing afterwards
    assert not reasons(decide(snapshot=snap(c.COND_READY), deadline_s=30)).get(c.COND_FAILED)


@pytest.mark.parametrize(
    "source",
    [{"pod": pod(phase="Succeeded", ready=False)}, {"job": job("Complete")}, {"pod": pod(phase="Failed", ready=False)}],
)
def test_state_source_completed_without_capture(source: dict[str, Any]) -> None:
    assert reasons(decide(**source))[c.COND_FAILED] == (True, c.REASON_SOURCE_COMPLETED_WITHOUT_CAPTURE)


def test_state_job_deleted_before_capture() -> None:
    step = decide(job=None, job_expected=True, pod=pod())
    assert reasons(step)[c.COND_FAILED] == (True, c.REASON_SOURCE_COMPLETED_WITHOUT_CAPTURE)
    assert not decide(job=None, pod=pod(ready=False)).terminal  # not created yet: still pending


def test_state_terminal_is_final() -> None:
    status = {"conditions": [{"type": c.COND_FAILED, "status": "True", "reason": "X"}]}
    step = decide(status=status, pod=pod(), snapshot=snap(c.COND_READY))
    assert step.terminal and not step.conditions and step.create_snapshot_for is None


# --- conditions ---------------------------------------------------------------------------------


def test_conditions_keep_transition_time_unless_status_flips() -> None:
    first = conditions.merged(None, [Condition("Ready", False, "Pending", "a")], now="t1")
    same = conditions.merged(first, [Condition("Ready", False, "Other", "b")], now="t2")
    flipped = conditions.merged(same, [Condition("Ready", True, "Done")], now="t3")
    assert [x["lastTransitionTime"] for x in (first[0], same[0], flipped[0])] == ["t1", "t1", "t3"]
    assert same[0]["reason"] == "Other" and len(flipped) == 1


def test_condition_patch_fn_replays_against_a_fresher_body() -> None:
    fn = conditions.patch_fn(Condition("Failed", True, "X"))
    body: dict[str, Any] = {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "P"}]}}
    fn(body)
    fn(body)  # kopf may apply it twice after a conflict
    assert [x["type"] for x in body["status"]["conditions"]] == ["Ready", "Failed"]


# --- PodSnapshot mirroring ----------------------------------------------------------------------


def content(ready: str | None, failed: bool = False) -> dict[str, Any]:
    conds = []
    if ready is not None:
        conds.append(
            {
                "type": c.COND_READY,
                "status": ready,
                "reason": "CaptureCompleted" if ready == "True" else "CaptureInProgress",
            }
        )
    if failed:
        conds.append({"type": c.COND_FAILED, "status": "True", "reason": c.REASON_POD_NOT_FOUND, "message": "gone"})
    return {
        "metadata": {"name": "podsnapshotcontent-u"},
        "status": {
            "conditions": conds,
            "artifact": {"sizeBytes": 5, "digest": "sha256:x"},
            "source": {"node": "n", "arch": "x86_64", "extra": 1},
        },
    }


def test_mirror_pending_ready_and_sticky_failed() -> None:
    snapshot: dict[str, Any] = {"metadata": {}, "status": {}}
    assert mirror(snapshot, content("False"))
    assert conditions.reason_of(snapshot["status"]["conditions"], c.COND_READY) == c.REASON_PENDING
    assert not mirror(snapshot, content("False"))  # nothing changed: no write
    assert mirror(snapshot, content("True"))
    assert snapshot["status"]["artifact"]["sizeBytes"] == 5 and snapshot["status"]["source"] == {
        "node": "n",
        "arch": "x86_64",
    }
    failed: dict[str, Any] = {"metadata": {}, "status": {}}
    assert mirror(failed, content(None, failed=True))
    assert conditions.is_true(failed["status"]["conditions"], c.COND_FAILED)
    assert not conditions.is_true(failed["status"]["conditions"], c.COND_READY)
    assert not mirror(failed, content("True"))  # Failed is sticky


# --- restore pod shaping ------------------------------------------------------------------------


def test_restore_pod_gets_placeholder_control_dir_and_startup_probe() -> None:
    pod_in = {
        "metadata": {"labels": {"app": "w"}},
        "spec": {
            "containers": [
                {"name": "main", "image": "w", "command": ["serve"], "args": ["--x"]},
                {"name": "log", "image": "l"},
            ]
        },
    }
    out = restore_pod.shape(pod_in, snapshot="s1", container="main")
    main, log = out["spec"]["containers"]
    # the placeholder, with the original command and args to start cold
    assert main["command"] == placeholder.command(["serve", "--x"]) and "args" not in main
    assert out["metadata"]["annotations"][c.ANNOTATION_RESTORE_FROM] == "s1"
    assert out["metadata"]["labels"] == {"app": "w", c.LABEL_RESTORE: "true"}
    assert out["spec"]["shareProcessNamespace"] is True
    assert main["startupProbe"]["exec"]["command"] == ["sh", "-c", placeholder.STARTUP_PROBE_SCRIPT]
    assert log == {"name": "log", "image": "l"}
    assert pod_in["spec"]["containers"][0]["command"] == ["serve"]


def test_standby_container_keeps_its_command() -> None:
    env = [{"name": c.ENV_RESTORE_STANDBY, "value": "1"}]
    pod_in = {"spec": {"containers": [{"name": "main", "command": ["podsnap-run", "--", "serve"], "env": env}]}}
    main = restore_pod.shape(pod_in, snapshot="s", container="main")["spec"]["containers"][0]
    assert main["command"] == ["podsnap-run", "--", "serve"]


def test_a_container_without_a_command_is_left_cold() -> None:
    """The image's entrypoint is not in the pod spec, so nothing could start the worker cold after a failed
    restore: such a pod is not shaped at all (the webhook leaves it untouched)."""
    with pytest.raises(restore_pod.NotShapeable, match="has no command"):
        restore_pod.shape({"spec": {"containers": [{"name": "main", "args": ["--x"]}]}}, snapshot="s", container="main")


def test_shaping_a_pod_without_the_container_is_refused() -> None:
    with pytest.raises(restore_pod.NotShapeable, match="'main' not in the pod"):
        restore_pod.shape({"spec": {"containers": [{"name": "x"}]}}, snapshot="s", container="main")


# --- SnapshotPolicy -----------------------------------------------------------------------------


def test_template_hash_ignores_controller_labels_and_sees_real_changes() -> None:
    base = {"metadata": {"labels": {"app": "w"}}, "spec": {"containers": [{"name": "main", "image": "w:1"}]}}
    rs = json.loads(json.dumps(base))
    rs["metadata"]["labels"]["pod-template-hash"] = "abc"
    changed = json.loads(json.dumps(base))
    changed["spec"]["containers"][0]["image"] = "w:2"
    assert policy.template_hash(base) == policy.template_hash(rs) != policy.template_hash(changed)
    assert "labels" not in policy.capture_template(base)["metadata"]


def test_hold_and_release_round_trip_the_replica_count() -> None:
    dep = {"metadata": {"annotations": {}}, "spec": {"replicas": 3}}
    hold = policy.hold_patch(dep)
    assert hold == {"metadata": {"annotations": {c.ANNOTATION_HELD_REPLICAS: "3"}}, "spec": {"replicas": 0}}
    held = {"metadata": {"annotations": {c.ANNOTATION_HELD_REPLICAS: "3"}}, "spec": {"replicas": 0}}
    assert policy.hold_patch(held) is None  # holding twice keeps the first count
    assert policy.release_patch(held) == {
        "metadata": {"annotations": {c.ANNOTATION_HELD_REPLICAS: None}},
        "spec": {"replicas": 3},
    }
    assert policy.release_patch(dep) is None


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"targetRef": {"kind": "DaemonSet", "name": "x"}}, "targetRef.kind"),
        ({"targetRef": {"kind": "Deployment"}}, "targetRef.name"),
        ({"targetRef": {"kind": "Deployment", "name": "x"}, "startupPolicy": "Later"}, "startupPolicy"),
    ],
)
def test_invalid_policies_name_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(policy.InvalidPolicy, match=field):
        policy.parse_spec(spec)


# --- agent host-side helpers --------------------------------------------------------------------


def test_control_files_are_written_through_the_process_root(tmp_path: Path) -> None:
    (tmp_path / "5" / "root" / "snapshot-control").mkdir(parents=True)
    control.signal_restored(control.control_dir(5, "/snapshot-control", tmp_path), {"POD_NAME": "new"})
    directory = tmp_path / "5" / "root" / "snapshot-control"
    assert c.RestoreContext.from_json((directory / c.FILE_RESTORE_CONTEXT).read_text()).env == {"POD_NAME": "new"}
    assert (directory / c.FILE_RESTORE_COMPLETE).exists()
    with pytest.raises(FileNotFoundError, match="volume mounted"):
        control.signal_restored(control.control_dir(6, "/snapshot-control", tmp_path), {})


def test_artifact_paths_cannot_leave_the_root(tmp_path: Path) -> None:
    assert artifact_dir(tmp_path, "ns/snap-uid") == tmp_path.resolve() / "ns" / "snap-uid"
    with pytest.raises(ExecutionError, match="leaves the artifact root"):
        artifact_dir(tmp_path, "../../etc")


def test_wait_for_checkpoint_gate_uses_scheduling_gates_where_the_server_has_them() -> None:
    import types

    import kopf

    from podsnap.operator.on_pod_create import hold

    pod = {"spec": {"nodeSelector": {"gpu": "h200"}, "containers": [{"name": "main"}]}}
    for gates, key in ((True, "schedulingGates"), (False, "nodeSelector")):
        patch = kopf.Patch()
        hold(types.SimpleNamespace(scheduling_gates=gates), pod, patch)  # type: ignore[arg-type]
        assert list(patch["spec"]) == [key]
    gated = kopf.Patch()
    hold(types.SimpleNamespace(scheduling_gates=True), pod, gated)  # type: ignore[arg-type]
    assert gated["spec"]["schedulingGates"] == [{"name": c.SCHEDULING_GATE_WAIT}]
    pinned = kopf.Patch()
    hold(types.SimpleNamespace(scheduling_gates=False), pod, pinned)  # type: ignore[arg-type]
    assert pinned["spec"]["nodeSelector"] == {"gpu": "h200", c.SCHEDULING_GATE_WAIT: "true"}
