"""SnapshotPolicy logic that needs no API server: template hash, names, capture attempts and their backoff,
holding replicas and pods."""

from __future__ import annotations

import datetime
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from podsnap import contract as c
from podsnap.kube.conditions import parse_time

TARGET_KINDS = ("Deployment", "StatefulSet")
#: labels and annotations controllers add to a pod template that do not change what runs
_VOLATILE_TEMPLATE_KEYS = ("pod-template-hash", "controller-revision-hash", "kubectl.kubernetes.io/restartedAt")


class InvalidPolicy(ValueError):
    """A policy spec the operator refuses; the message names the field and the fix."""


@dataclass(frozen=True)
class PolicySpec:
    kind: str
    target: str
    startup: str
    deletion: str
    container: str
    checkpoint_ref: str | None
    #: what a restore pod does when its restore fails: ColdStart (its command, in the same pod) or Fail
    on_failure: str = c.RESTORE_FAILURE_COLD_START


def parse_spec(spec: Mapping[str, Any] | None) -> PolicySpec:
    spec = spec or {}
    ref = spec.get("targetRef") or {}
    kind, name = ref.get("kind"), ref.get("name")
    if kind not in TARGET_KINDS:
        raise InvalidPolicy(f"spec.targetRef.kind must be one of {list(TARGET_KINDS)}, got {kind!r}")
    if not name:
        raise InvalidPolicy("spec.targetRef.name is required: name the Deployment or StatefulSet in this namespace")
    startup = spec.get("startupPolicy") or c.STARTUP_POLICY_IMMEDIATE
    if startup not in (c.STARTUP_POLICY_IMMEDIATE, c.STARTUP_POLICY_WAIT):
        raise InvalidPolicy(f"spec.startupPolicy must be Immediate or WaitForCheckpoint, got {startup!r}")
    deletion = spec.get("deletionPolicy") or c.DELETION_POLICY_DELETE
    if deletion not in (c.DELETION_POLICY_DELETE, c.DELETION_POLICY_RETAIN):
        raise InvalidPolicy(f"spec.deletionPolicy must be Delete or Retain, got {deletion!r}")
    on_failure = spec.get("restoreFailurePolicy") or c.RESTORE_FAILURE_COLD_START
    if on_failure not in c.RESTORE_FAILURE_POLICIES:
        raise InvalidPolicy(f"spec.restoreFailurePolicy must be ColdStart or Fail, got {on_failure!r}")
    ref_name = (spec.get("checkpointRef") or {}).get("name") or None
    container = spec.get("targetContainerName") or "main"
    return PolicySpec(kind, name, startup, deletion, container, ref_name, on_failure)


def canonical_template(template: Mapping[str, Any]) -> dict[str, Any]:
    meta = dict(template.get("metadata") or {})
    for key in ("labels", "annotations"):
        meta[key] = {k: v for k, v in (meta.get(key) or {}).items() if k not in _VOLATILE_TEMPLATE_KEYS}
    meta.pop("creationTimestamp", None)
    return {"metadata": meta, "spec": template.get("spec") or {}}


def template_hash(template: Mapping[str, Any]) -> str:
    """Short, stable hash of what a pod template runs: one checkpoint per hash."""
    text = json.dumps(canonical_template(template), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def snapshot_job_name(policy: str, hash_: str) -> str:
    base = policy if len(policy) <= 40 else f"{policy[:31]}-{hashlib.sha256(policy.encode()).hexdigest()[:8]}"
    return f"{base}-{hash_}"


def capture_template(template: Mapping[str, Any]) -> dict[str, Any]:
    """The pod template a SnapshotJob runs: the target's, without its labels, so the quiesced capture pod
    never matches the workload's Service or ReplicaSet selectors."""
    shaped = canonical_template(template)
    shaped["metadata"].pop("labels", None)
    return shaped


def hold_patch(target: Mapping[str, Any]) -> dict[str, Any] | None:
    """The patch that holds a workload at zero replicas, remembering its count; None when already held."""
    annotations = (target.get("metadata") or {}).get("annotations") or {}
    if c.ANNOTATION_HELD_REPLICAS in annotations:
        return None
    replicas = (target.get("spec") or {}).get("replicas")
    replicas = 1 if replicas is None else int(replicas)
    return {"metadata": {"annotations": {c.ANNOTATION_HELD_REPLICAS: str(replicas)}}, "spec": {"replicas": 0}}


def release_patch(target: Mapping[str, Any]) -> dict[str, Any] | None:
    """The patch that gives a held workload its replica count back; None when not held."""
    annotations = (target.get("metadata") or {}).get("annotations") or {}
    held = annotations.get(c.ANNOTATION_HELD_REPLICAS)
    if held is None:
        return None
    try:
        replicas = int(held)
    except ValueError:
        replicas = 1
    return {"metadata": {"annotations": {c.ANNOTATION_HELD_REPLICAS: None}}, "spec": {"replicas": replicas}}


# --- capture attempts, holds and held pods (issue 16) -----------------------------------------------
#: a failed capture (or a lost artifact) is tried again after BASE * 2^(attempt-1) seconds, at most MAX
RETRY_BASE_S = 30.0
RETRY_MAX_S = 900.0


def backoff_s(attempt: int, base_s: float = RETRY_BASE_S, max_s: float = RETRY_MAX_S) -> float:
    """The delay after attempt `attempt` failed."""
    return float(min(base_s * 2 ** max(0, attempt - 1), max_s))


def attempt_job_name(policy: str, hash_: str, attempt: int) -> str:
    base = snapshot_job_name(policy, hash_)
    return base if attempt <= 1 else f"{base}-{attempt}"


@dataclass(frozen=True)
class Attempt:
    """The capture attempt a policy is on for its target's current template."""

    number: int
    job_name: str
    #: a retry scheduled for then: its SnapshotJob is created once the time has come
    next_at: datetime.datetime | None = None
    #: why the previous attempt failed (while a retry waits)
    last_failure: str = ""

    def waiting(self, now: datetime.datetime) -> bool:
        return self.next_at is not None and now < self.next_at


def attempt_of(status: Mapping[str, Any], policy: str, hash_: str) -> Attempt:
    """From the policy's status; a new template starts over at attempt 1."""
    if status.get("templateHash") != hash_:
        return Attempt(1, attempt_job_name(policy, hash_, 1))
    number = int(status.get("captureAttempt") or 1)
    next_at = parse_time(status.get("nextCaptureAt"))
    return Attempt(number, attempt_job_name(policy, hash_, number), next_at, str(status.get("lastFailure") or ""))


def serving_replicas(kind: str, target: Mapping[str, Any]) -> int:
    """Replicas of the target that serve now (available for a Deployment, ready for a StatefulSet)."""
    status = target.get("status") or {}
    return int(status.get("availableReplicas" if kind == "Deployment" else "readyReplicas") or 0)


def held_at_zero(target: Mapping[str, Any]) -> bool:
    return c.ANNOTATION_HELD_REPLICAS in ((target.get("metadata") or {}).get("annotations") or {})


def should_hold(policy: PolicySpec, *, ready: bool, failed: bool, attempt: int, target: Mapping[str, Any]) -> bool:
    """WaitForCheckpoint holds new pods only while nothing serves yet (or podsnap itself holds the workload at
    zero) and the first capture of this template runs: a template change on a serving workload, a failed
    capture and its retries all leave the workload serving (its new pods start cold)."""
    if policy.startup != c.STARTUP_POLICY_WAIT or ready or failed or attempt > 1:
        return False
    return held_at_zero(target) or serving_replicas(policy.kind, target) == 0


def held_pod(pod: Mapping[str, Any]) -> bool:
    """A pod the webhook held for a checkpoint (gate or node selector only podsnap satisfies), not scheduled."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return False
    gates = [g.get("name") for g in spec.get("schedulingGates") or []]
    return c.SCHEDULING_GATE_WAIT in gates or c.SCHEDULING_GATE_WAIT in (spec.get("nodeSelector") or {})


def selector_of(target: Mapping[str, Any]) -> str:
    """The target's pod selector as a label selector string (matchLabels; "" when it has none)."""
    labels = ((target.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
