"""`podsnap status` without an API server: target names, how a pod started, which failure is the last,
the timings format on the objects, and the readable timing lines."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from podsnap import contract as c
from podsnap.cli import status_doc as d
from podsnap.cli.status import EXIT_USAGE, StatusError, Target, parse_target
from podsnap.cli.status_text import CAPTURE_ORDER, RESTORE_ORDER, ago, timing_line

NOW = datetime.datetime(2026, 12, 1, 12, 0, 0, tzinfo=datetime.UTC)


@pytest.mark.parametrize(
    ("words", "kind", "name"),
    [
        (["policy/web"], c.KIND_SNAPSHOT_POLICY, "web"),
        (["snappolicy", "web"], c.KIND_SNAPSHOT_POLICY, "web"),
        (["SnapshotPolicy/web"], c.KIND_SNAPSHOT_POLICY, "web"),
        (["snapshotpolicies.podsnap.io/web"], c.KIND_SNAPSHOT_POLICY, "web"),
        (["podsnap/s"], c.KIND_POD_SNAPSHOT, "s"),
        (["podsnapshots", "s"], c.KIND_POD_SNAPSHOT, "s"),
        (["snapjob/j"], c.KIND_SNAPSHOT_JOB, "j"),
        (["po/web-0"], "Pod", "web-0"),
    ],
)
def test_targets_take_kubectls_names(words: list[str], kind: str, name: str) -> None:
    assert parse_target(words) == Target(kind, name)


@pytest.mark.parametrize(
    ("words", "message"),
    [(["web"], "expected KIND/NAME"), (["widget/x"], "unknown kind 'widget'"), (["pod/"], "name is missing")],
)
def test_bad_targets_say_what_to_type(words: list[str], message: str) -> None:
    with pytest.raises(StatusError, match=message) as caught:
        parse_target(words)
    assert caught.value.code == EXIT_USAGE


def pod(created: str = "2026-12-01T11:50:00Z", *, annotations: dict[str, str] | None = None, **spec: Any) -> dict:
    return {
        "metadata": {"name": "p", "creationTimestamp": created, "annotations": annotations or {}},
        "spec": spec,
        "status": {"conditions": []},
    }


def with_restored(p: dict, status: str, reason: str) -> dict:
    p["status"]["conditions"].append(
        {
            "type": c.POD_CONDITION_RESTORED,
            "status": status,
            "reason": reason,
            "message": "m",
            "lastTransitionTime": "x",
        }
    )
    return p


POLICY = {"checkpointName": "snap"}
READY_AT_1155 = {"state": "Ready", "since": "2026-12-01T11:55:00Z"}


@pytest.mark.parametrize(
    ("the_pod", "policy", "checkpoint", "start", "reason"),
    [
        (with_restored(pod(), "True", c.REASON_RESTORE_SUCCEEDED), POLICY, READY_AT_1155, "restored", None),
        (with_restored(pod(), "False", c.REASON_RESTORE_IN_PROGRESS), POLICY, READY_AT_1155, "restoring", None),
        (with_restored(pod(), "False", c.REASON_RESTORE_FAILED), POLICY, READY_AT_1155, "fallback", None),
        (with_restored(pod(), "False", c.REASON_RESTORE_INCOMPATIBLE), POLICY, READY_AT_1155, "fallback", None),
        (pod(nodeSelector={c.SCHEDULING_GATE_WAIT: "true"}), POLICY, None, "held", c.STARTUP_POLICY_WAIT),
        (pod(schedulingGates=[{"name": c.SCHEDULING_GATE_WAIT}]), POLICY, None, "held", c.STARTUP_POLICY_WAIT),
        (pod(annotations={c.ANNOTATION_RESTORE_FROM: "snap"}), POLICY, READY_AT_1155, "waiting", d.WAITING_FOR_AGENT),
        (pod(), None, None, "cold", d.COLD_NO_POLICY),
        (pod(), POLICY, {"state": "Pending", "since": None}, "cold", d.COLD_CHECKPOINT_NOT_READY),
        (pod("2026-12-01T11:50:00Z"), POLICY, READY_AT_1155, "cold", d.COLD_CHECKPOINT_NOT_READY),
        (pod("2026-12-01T11:58:00Z"), POLICY, READY_AT_1155, "cold", d.COLD_NOT_SHAPED),
    ],
)
def test_how_a_pod_started(
    the_pod: dict, policy: dict | None, checkpoint: dict | None, start: str, reason: str | None
) -> None:
    got_start, got_reason, message = d.how_started(the_pod, policy=policy, checkpoint=checkpoint)
    assert got_start == start
    assert got_reason == (reason or the_pod["status"]["conditions"][0]["reason"])
    assert message


def test_the_last_failure_is_the_captures_root_cause_or_a_later_pod() -> None:
    policy = {"name": "pol", "ready": False, "reason": c.REASON_CHECKPOINT_FAILED, "message": "wraps", "since": "T3"}
    job = {"name": "j", "state": c.COND_FAILED, "reason": c.REASON_CAPTURE_FAILED, "message": "job", "since": "T2"}
    snap = {"name": "s", "state": "Failed", "reason": c.REASON_CAPTURE_FAILED, "message": "root", "since": "T1"}
    assert d.last_failure(policy=policy, job=job, checkpoint=snap, pods=[])["object"] == "PodSnapshot/s"
    assert d.last_failure(policy=policy, job=job, checkpoint=None, pods=[])["object"] == "SnapshotJob/j"
    assert d.last_failure(policy=policy, job=None, checkpoint=None, pods=[])["object"] == "SnapshotPolicy/pol"
    fallback = {"name": "p", "start": "fallback", "reason": "RestoreFailed", "message": "x", "since": "T4"}
    assert d.last_failure(policy=policy, job=job, checkpoint=snap, pods=[fallback])["object"] == "Pod/p"
    ok = {**policy, "ready": True, "reason": c.REASON_CHECKPOINT_READY}
    assert d.last_failure(policy=ok, job=None, checkpoint=None, pods=[]) is None


def test_checkpoint_view_of_a_missing_snapshot_keeps_every_key() -> None:
    ready = {
        "metadata": {"name": "s"},
        "status": {
            "capturedAt": "2026-12-01T11:00:00Z",
            "conditions": [{"type": "Ready", "status": "True", "reason": "CaptureCompleted"}],
        },
    }
    view = d.checkpoint_view(ready, NOW)
    assert view["state"] == "Ready" and view["ageSeconds"] == 3600
    missing = d.checkpoint_view(None, NOW, name="gone")
    assert missing["state"] == "Missing" and set(missing) == set(view)


def test_timings_annotation_is_compact_and_its_parser_tolerant() -> None:
    text = c.format_timings({"verify": 750.04, "criu_restore": 1200.56, c.TIMING_AGENT_TOTAL: 3000})
    assert text == '{"agent_total":3000.0,"criu_restore":1200.6,"verify":750.0}'
    assert c.parse_timings(text) == {"agent_total": 3000.0, "criu_restore": 1200.6, "verify": 750.0}
    assert c.parse_timings('{"verify": 1, "note": "newer field", "flag": true}') == {"verify": 1.0}
    for bad in (None, "", "not json", "[1]"):
        assert c.parse_timings(bad) == {}


def test_timing_lines_follow_the_engines_phase_order() -> None:
    restore = {"total": 2850.7, "cuda_restore": 900.2, "verify": 750.0, "criu_restore": 1200.5, "zz": 1.0}
    line = timing_line({**restore, c.TIMING_AGENT_TOTAL: 3104.9}, RESTORE_ORDER)
    assert line == "2.85 s: verify 0.75 s · criu_restore 1.20 s · cuda_restore 0.90 s · zz 0.00 s (agent 3.10 s)"
    assert timing_line({c.TIMING_AGENT_TOTAL: 1500.0}, CAPTURE_ORDER) == "1.50 s"
    assert timing_line(None, CAPTURE_ORDER) == "not recorded"


def test_ages_read_like_kubectls() -> None:
    assert [ago(t, NOW) for t in ("2026-12-01T11:59:15Z", "2026-12-01T11:48:00Z", "2026-11-29T12:00:00Z")] == [
        "45s",
        "12m",
        "2d",
    ]


def test_label_selectors_become_list_selectors() -> None:
    sel = {
        "matchLabels": {"app": "web", "tier": "a"},
        "matchExpressions": [
            {"key": "env", "operator": "In", "values": ["prod", "stage"]},
            {"key": "canary", "operator": "DoesNotExist"},
        ],
    }
    assert d.label_selector(sel) == "app=web,tier=a,env in (prod,stage),!canary"
    assert d.label_selector(None) is None


def test_the_json_document_keeps_its_documented_keys() -> None:
    """The keys scripts rely on (status_doc's docstring); a change here is a change of the output format."""
    policy = d.policy_view({"metadata": {"name": "pol"}, "spec": {"targetRef": {"kind": "Deployment", "name": "w"}}})
    job = d.job_view({"metadata": {"name": "j"}})
    checkpoint = d.checkpoint_view(None, NOW, name="s")
    the_pod = d.pod_view(pod(), policy=policy, checkpoint=checkpoint)
    doc = d.document({"kind": "Pod", "namespace": "n", "name": "p"}, NOW, policy=policy, job=job, pods=[the_pod])
    assert set(doc) == {
        "apiVersion", "kind", "target", "generatedAt", "policy", "snapshotJob", "checkpoint", "pods",
        "lastFailure", "warnings",
    }  # fmt: skip
    assert (doc["apiVersion"], doc["kind"]) == ("podsnap.io/v1alpha1", "StatusReport")
    assert set(policy) == {
        "name", "targetRef", "startupPolicy", "deletionPolicy", "ready", "checkpointName", "templateHash",
        "snapshotJobName", "reason", "message", "since",
    }  # fmt: skip
    assert set(job) == {
        "name", "state", "reason", "message", "since", "podName", "podSnapshotName", "startedAt", "completedAt",
    }  # fmt: skip
    assert set(checkpoint) == {
        "name", "state", "reason", "message", "since", "node", "sizeBytes", "digest", "capturedAt", "ageSeconds",
        "content", "sourcePod", "source", "captureTimingsMs",
    }  # fmt: skip
    assert set(the_pod) == {
        "name", "node", "phase", "ready", "createdAt", "start", "reason", "message", "since", "restoredFrom",
        "restoreTimingsMs",
    }  # fmt: skip
