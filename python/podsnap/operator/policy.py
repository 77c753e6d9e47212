"""SnapshotPolicy logic that needs no API server: template hash, names, replica holding."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from podsnap import contract as c

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
    ref_name = (spec.get("checkpointRef") or {}).get("name") or None
    return PolicySpec(kind, name, startup, deletion, spec.get("targetContainerName") or "main", ref_name)


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
