"""The `podsnap status` document, built from the API objects as read (pure: no API calls, `now` passed in).

The document is the `-o json` output and what the text view renders. Its shape is stable: every key is
always present (null or [] when it does not apply), so scripts can rely on it::

    apiVersion, kind ("StatusReport": the command's output, not a Kubernetes object),
    target {kind, namespace, name}, generatedAt,
    policy       {name, targetRef, startupPolicy, deletionPolicy, ready, checkpointName, templateHash,
                  snapshotJobName, reason, message, since} | null
    snapshotJob  {name, state, reason, message, since, podName, podSnapshotName, startedAt, completedAt} | null
    checkpoint   {name, state, reason, message, since, node, sizeBytes, digest, capturedAt, ageSeconds,
                  content, sourcePod, source {kernel, arch, driver, gpus[]}, captureTimingsMs} | null
    pods         [{name, node, phase, ready, createdAt, start, reason, message, since, restoredFrom,
                   restoreTimingsMs}]
    lastFailure  {object, reason, message, at} | null
    warnings     [what could not be read, and why]

`pods[].start` says how each pod started: `restored`, `restoring`, `waiting` (shaped for restore, the
agent has not started), `fallback` (the restore failed or was refused; the reason says why), `held`
(WaitForCheckpoint), or `cold` (never shaped for restore; the reason says why, as far as the objects tell).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from podsnap import contract as c
from podsnap.kube.conditions import find, parse_time

DOC_API_VERSION = "podsnap.io/v1alpha1"
DOC_KIND = "StatusReport"

START_RESTORED = "restored"
START_RESTORING = "restoring"
START_WAITING = "waiting"
START_FALLBACK = "fallback"
START_HELD = "held"
START_COLD = "cold"

#: why a pod started cold (podsnap's webhook does not record it; these are read off the objects)
COLD_NO_POLICY = "NoPolicy"
COLD_CHECKPOINT_NOT_READY = "CheckpointNotReady"
COLD_NOT_SHAPED = "NotShaped"
HELD_WAIT = c.STARTUP_POLICY_WAIT
WAITING_FOR_AGENT = "WaitingForAgent"

#: SnapshotPolicy Ready reasons that are failures (the others are progress)
POLICY_FAILURE_REASONS = (c.REASON_CHECKPOINT_FAILED, c.REASON_TARGET_NOT_FOUND, c.REASON_INVALID_SPEC)

Doc = dict[str, Any]


def _age_s(stamp: str | None, now: datetime.datetime) -> int | None:
    at = parse_time(stamp)
    return None if at is None else max(0, int((now - at).total_seconds()))


def _cond(conds: Sequence[Mapping[str, Any]] | None, type_: str) -> tuple[str | None, str | None, str | None]:
    """(reason, message, lastTransitionTime) of a condition, all None when it is absent."""
    cond = find(conds, type_)
    if cond is None:
        return None, None, None
    return cond.get("reason"), cond.get("message"), cond.get("lastTransitionTime")


def _true(conds: Sequence[Mapping[str, Any]] | None, type_: str) -> bool:
    cond = find(conds, type_)
    return cond is not None and cond.get("status") == "True"


def timings(raw: Any) -> dict[str, float] | None:
    """A timings map as read from a status field (numbers only), or None."""
    if not isinstance(raw, Mapping) or not raw:
        return None
    out = {str(k): float(v) for k, v in raw.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    return out or None


def policy_view(policy: Mapping[str, Any]) -> Doc:
    spec, status = policy.get("spec") or {}, policy.get("status") or {}
    reason, message, since = _cond(status.get("conditions"), c.COND_READY)
    ref = spec.get("targetRef") or {}
    return {
        "name": policy["metadata"]["name"],
        "targetRef": {"kind": ref.get("kind"), "name": ref.get("name")},
        "startupPolicy": spec.get("startupPolicy") or c.STARTUP_POLICY_IMMEDIATE,
        "deletionPolicy": spec.get("deletionPolicy") or c.DELETION_POLICY_DELETE,
        "ready": bool(status.get("ready")),
        "checkpointName": status.get("checkpointName") or (spec.get("checkpointRef") or {}).get("name"),
        "templateHash": status.get("templateHash"),
        "snapshotJobName": status.get("snapshotJobName"),
        "reason": reason,
        "message": message,
        "since": since,
    }


def job_view(job: Mapping[str, Any]) -> Doc:
    status = job.get("status") or {}
    conds = status.get("conditions")
    state = "Pending"
    for type_ in (c.COND_FAILED, c.COND_COMPLETED, c.COND_CAPTURED, c.COND_RUNNING):
        if _true(conds, type_):
            state = type_
            break
    reason, message, since = _cond(conds, state) if state != "Pending" else (None, None, None)
    if state == "Pending" and conds:
        last = max(conds, key=lambda x: x.get("lastTransitionTime") or "")
        reason, message, since = last.get("reason"), last.get("message"), last.get("lastTransitionTime")
    return {
        "name": job["metadata"]["name"],
        "state": state,
        "reason": reason,
        "message": message,
        "since": since,
        "podName": status.get("podName"),
        "podSnapshotName": status.get("podSnapshotName"),
        "startedAt": status.get("startedAt"),
        "completedAt": status.get("completedAt"),
    }


def checkpoint_view(snapshot: Mapping[str, Any] | None, now: datetime.datetime, *, name: str | None = None) -> Doc:
    """A PodSnapshot as a checkpoint; `snapshot` None means it does not exist (state Missing)."""
    if snapshot is None:
        return {
            "name": name,
            "state": "Missing",
            "reason": "NotFound",
            "message": f"PodSnapshot {name} does not exist",
            "since": None,
            "node": None,
            "sizeBytes": None,
            "digest": None,
            "capturedAt": None,
            "ageSeconds": None,
            "content": None,
            "sourcePod": None,
            "source": None,
            "captureTimingsMs": None,
        }
    status = snapshot.get("status") or {}
    conds = status.get("conditions")
    if _true(conds, c.COND_FAILED):
        state = "Failed"
        reason, message, since = _cond(conds, c.COND_FAILED)
    else:
        state = "Ready" if _true(conds, c.COND_READY) else "Pending"
        reason, message, since = _cond(conds, c.COND_READY)
    artifact, source = status.get("artifact") or {}, status.get("source") or {}
    pod_ref = ((snapshot.get("spec") or {}).get("source") or {}).get("podRef") or {}
    return {
        "name": snapshot["metadata"]["name"],
        "state": state,
        "reason": reason or (c.REASON_PENDING if state == "Pending" else None),
        "message": message,
        "since": since,
        "node": source.get("node"),
        "sizeBytes": artifact.get("sizeBytes"),
        "digest": artifact.get("digest"),
        "capturedAt": status.get("capturedAt"),
        "ageSeconds": _age_s(status.get("capturedAt"), now),
        "content": status.get("boundSnapshotContentName"),
        "sourcePod": pod_ref.get("name"),
        "source": {
            "kernel": source.get("kernel"),
            "arch": source.get("arch"),
            "driver": source.get("driver") or None,
            "gpus": [g.get("name") or g.get("uuid") or "?" for g in source.get("gpus") or []],
        }
        if source
        else None,
        "captureTimingsMs": timings(status.get("captureTimingsMs")),
    }


def _held(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    gates = [g.get("name") for g in spec.get("schedulingGates") or []]
    return c.SCHEDULING_GATE_WAIT in gates or c.SCHEDULING_GATE_WAIT in (spec.get("nodeSelector") or {})


def how_started(
    pod: Mapping[str, Any], *, policy: Mapping[str, Any] | None, checkpoint: Mapping[str, Any] | None
) -> tuple[str, str, str]:
    """(start, reason, message) of a pod: restored, restoring, waiting, fallback, held or cold.

    `policy` is the policy view of the pod's workload (None: no policy targets it); `checkpoint` the view
    of that policy's checkpoint, whose Ready time tells a pod made too early from one the webhook missed."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    snapshot = annotations.get(c.ANNOTATION_RESTORE_FROM)
    cond = find((pod.get("status") or {}).get("conditions"), c.POD_CONDITION_RESTORED)
    if cond is not None:
        reason, message = str(cond.get("reason") or ""), str(cond.get("message") or "")
        if cond.get("status") == "True":
            return START_RESTORED, reason, message
        if reason == c.REASON_RESTORE_IN_PROGRESS:
            return START_RESTORING, reason, message
        return START_FALLBACK, reason, message
    if _held(pod):
        return START_HELD, HELD_WAIT, "held until the checkpoint is Ready (startupPolicy WaitForCheckpoint)"
    if snapshot:
        where = (pod.get("spec") or {}).get("nodeName")
        msg = f"shaped to restore from {snapshot}; " + (
            f"the agent on {where} has not started the restore yet" if where else "the pod is not scheduled yet"
        )
        return START_WAITING, WAITING_FOR_AGENT, msg
    if policy is None:
        return START_COLD, COLD_NO_POLICY, "no SnapshotPolicy targets this pod's workload"
    name = policy.get("checkpointName") or "(none)"
    created = parse_time(meta.get("creationTimestamp"))
    ready_at = parse_time(checkpoint.get("since")) if checkpoint and checkpoint.get("state") == "Ready" else None
    if ready_at is None or (created is not None and created < ready_at):
        return START_COLD, COLD_CHECKPOINT_NOT_READY, f"created before checkpoint {name} was Ready"
    return (
        START_COLD,
        COLD_NOT_SHAPED,
        f"created after checkpoint {name} was Ready but not shaped for restore: the pod webhook was off or "
        "unreachable, or the pod's template is not the one captured (see the operator's log)",
    )


def pod_view(
    pod: Mapping[str, Any], *, policy: Mapping[str, Any] | None = None, checkpoint: Mapping[str, Any] | None = None
) -> Doc:
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    annotations = meta.get("annotations") or {}
    start, reason, message = how_started(pod, policy=policy, checkpoint=checkpoint)
    restored = find(status.get("conditions"), c.POD_CONDITION_RESTORED)
    return {
        "name": meta.get("name"),
        "node": spec.get("nodeName"),
        "phase": status.get("phase"),
        "ready": _true(status.get("conditions"), "Ready"),
        "createdAt": meta.get("creationTimestamp"),
        "start": start,
        "reason": reason,
        "message": message,
        "since": restored.get("lastTransitionTime") if restored else None,
        "restoredFrom": annotations.get(c.ANNOTATION_RESTORE_FROM),
        "restoreTimingsMs": c.parse_timings(annotations.get(c.ANNOTATION_RESTORE_TIMINGS)) or None,
    }


def last_failure(*, policy: Doc | None, job: Doc | None, checkpoint: Doc | None, pods: Iterable[Doc]) -> Doc | None:
    """The most recent failure among the objects shown: the capture's (its root cause: the PodSnapshot's,
    else the SnapshotJob's, else the policy's own, since each wraps the one below it) or a pod's failed or
    refused restore."""
    found: list[Doc] = []
    if checkpoint and checkpoint["state"] in ("Failed", "Missing"):
        found.append(_failure(f"PodSnapshot/{checkpoint['name']}", checkpoint, checkpoint["since"]))
    elif job and job["state"] == c.COND_FAILED:
        found.append(_failure(f"SnapshotJob/{job['name']}", job, job["since"]))
    elif policy and not policy["ready"] and policy["reason"] in POLICY_FAILURE_REASONS:
        found.append(_failure(f"SnapshotPolicy/{policy['name']}", policy, policy["since"]))
    for pod in pods:
        if pod["start"] == START_FALLBACK:
            found.append(_failure(f"Pod/{pod['name']}", pod, pod["since"] or pod["createdAt"]))
    if not found:
        return None
    # the latest; a failure without a time (a missing object) counts as now
    return max(found, key=lambda f: f["at"] or "9999")


def _failure(obj: str, view: Mapping[str, Any], at: str | None) -> Doc:
    return {"object": obj, "reason": view.get("reason"), "message": view.get("message"), "at": at}


def document(
    target: Mapping[str, str],
    now: datetime.datetime,
    *,
    policy: Doc | None = None,
    job: Doc | None = None,
    checkpoint: Doc | None = None,
    pods: Sequence[Doc] = (),
    warnings: Sequence[str] = (),
) -> Doc:
    return {
        "apiVersion": DOC_API_VERSION,
        "kind": DOC_KIND,
        "target": dict(target),
        "generatedAt": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "policy": policy,
        "snapshotJob": job,
        "checkpoint": checkpoint,
        "pods": list(pods),
        "lastFailure": last_failure(policy=policy, job=job, checkpoint=checkpoint, pods=pods),
        "warnings": list(warnings),
    }


def label_selector(selector: Mapping[str, Any] | None) -> str | None:
    """A metav1.LabelSelector as the string list calls take; None when it selects nothing (no selector)."""
    if not selector:
        return None
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In":
            parts.append(f"{key} in ({','.join(values)})")
        elif op == "NotIn":
            parts.append(f"{key} notin ({','.join(values)})")
        elif op == "Exists":
            parts.append(str(key))
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
    return ",".join(parts) or None
