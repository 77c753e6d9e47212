"""Placement: a restore pod may land only on a node that can take its artifact.

Each agent labels its Node with the facts the restore gates compare (agent/node_labels.py). For a pod it
shapes, the webhook reads the artifact's recorded facts (its PodSnapshotContent's status.source, written by
the agent that captured it) and requires them of the pod's node: a required node affinity whose
matchExpressions are ANDed into every nodeSelectorTerm the pod already has (the terms are ORed, so each
must carry them; none of the user's terms or expressions is dropped).

When no Ready, schedulable node carries all of them, the pod could never be scheduled: under
restoreFailurePolicy ColdStart it is left unshaped and starts cold at once, under Fail it keeps the affinity
and stays Pending. Either way the webhook marks it (LABEL_PLACEMENT, and the message naming the facts no
node has), and on_placement.py gives it its Restored condition and an Event once it exists.

A policy's skipCompatCheck skips placement with the gates; `placement.enabled: false` turns it off.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from podsnap import contract as c
from podsnap.kube import conditions
from podsnap.kube.client import Kube
from podsnap.kube.placement_labels import Requirement, requirements

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Placement:
    required: tuple[Requirement, ...]
    #: "" when a Ready node carries every required label; else which facts no such node has
    unmatched: str = ""

    def expressions(self) -> list[dict[str, Any]]:
        return [r.expression() for r in self.required]


def artifact_source(kube: Kube, namespace: str, snapshot: str) -> Mapping[str, Any]:
    """The facts the capture of PodSnapshot `namespace/snapshot` recorded ({} when there is no content yet)."""
    snap = kube.get_cr(c.PLURAL_POD_SNAPSHOTS, snapshot, namespace)
    if snap is None:
        return {}
    content = kube.get_cr(c.PLURAL_POD_SNAPSHOT_CONTENTS, c.content_name(snap["metadata"]["uid"]))
    return ((content or {}).get("status") or {}).get("source") or {}


def schedulable(node: Mapping[str, Any]) -> bool:
    """Ready and not cordoned."""
    ready = conditions.is_true((node.get("status") or {}).get("conditions"), "Ready")
    return ready and not (node.get("spec") or {}).get("unschedulable")


def _expression_holds(expr: Mapping[str, Any], labels: Mapping[str, str], name: str, *, field: bool) -> bool:
    """One matchExpressions / matchFields entry, as the scheduler reads it."""
    key, op, values = expr.get("key"), expr.get("operator"), [str(v) for v in expr.get("values") or ()]
    value = (name if key == "metadata.name" else None) if field else labels.get(str(key))
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and values:
        try:
            return int(value) > int(values[0]) if op == "Gt" else int(value) < int(values[0])
        except ValueError:
            return False
    return False


def allows(pod_spec: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Whether the pod's own nodeSelector and required node affinity let it onto `node` (taints, resources
    and the rest of the scheduler's checks are left to the scheduler)."""
    meta = node.get("metadata") or {}
    labels, name = meta.get("labels") or {}, str(meta.get("name") or "")
    if any(labels.get(k) != v for k, v in (pod_spec.get("nodeSelector") or {}).items()):
        return False
    node_affinity = (pod_spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if not required:
        return True
    # the terms are ORed; an empty term matches no node
    return any(
        (term.get("matchExpressions") or term.get("matchFields"))
        and all(_expression_holds(e, labels, name, field=False) for e in term.get("matchExpressions") or ())
        and all(_expression_holds(e, labels, name, field=True) for e in term.get("matchFields") or ())
        for term in required.get("nodeSelectorTerms") or ()
    )


def unmatched(
    required: Sequence[Requirement], nodes: Sequence[Mapping[str, Any]], pod_spec: Mapping[str, Any] | None = None
) -> str:
    """ "" when one of `nodes` (Ready, schedulable, and allowed by the pod's own nodeSelector and required
    affinity) carries every requirement; else a sentence naming the facts. A node the pod itself excludes
    does not count: the ANDed affinity could never be met, and under ColdStart the pod must start cold."""
    ready = [n for n in nodes if schedulable(n)]
    allowed = [n for n in ready if allows(pod_spec or {}, n)]
    labelled = [(n.get("metadata") or {}).get("labels") or {} for n in allowed]
    if any(all(r.matches(labels) for r in required) for labels in labelled):
        return ""
    missing = [r for r in required if not any(r.matches(labels) for labels in labelled)]
    facts = ", ".join(r.describe() for r in missing or required)
    where = f"of {len(labelled)} Ready node(s) labelled by a podsnap agent"
    if len(allowed) < len(ready):
        where += f" that the pod's own nodeSelector and node affinity allow ({len(ready) - len(allowed)} excluded)"
    if missing:
        return f"no Ready node has the checkpoint's {facts} ({where}; labels {_selector(missing)})"
    return f"no single Ready node has all of the checkpoint's {facts} ({where})"


def _selector(required: Sequence[Requirement]) -> str:
    return ", ".join(f"{r.label}>{r.value}" if r.operator == "Gt" else f"{r.label}={r.value}" for r in required)


def placement_of(
    kube: Kube, namespace: str, snapshot: str, pod_spec: Mapping[str, Any] | None = None
) -> Placement | None:
    """What a restore pod (`pod_spec`) from `namespace/snapshot` must require of its node; None: nothing (no
    facts recorded, or the API server could not say: the gates still check the restore where the pod lands)."""
    try:
        required = tuple(requirements(artifact_source(kube, namespace, snapshot)))
        if not required:
            return None
        # only nodes an agent labelled can match; the label selector keeps the list short on big clusters
        nodes = kube.core.list_node(label_selector=required[0].label).items
    except ApiException as exc:
        log.warning("placement of a restore pod from %s/%s skipped: %s", namespace, snapshot, exc.reason)
        return None
    return Placement(required, unmatched(required, [kube.sanitize(n) for n in nodes], pod_spec))


def with_required(affinity: Mapping[str, Any] | None, expressions: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """`affinity` whose required node affinity also demands `expressions`, in every one of its terms."""
    out = copy.deepcopy(dict(affinity or {}))
    node = out.setdefault("nodeAffinity", {})
    required = node.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    required["nodeSelectorTerms"] = [
        {**term, "matchExpressions": [*(term.get("matchExpressions") or []), *map(dict, expressions)]} for term in terms
    ]
    return out


def mark(meta: dict[str, Any], message: str) -> None:
    """Mark a pod's metadata as one no node can take now (on_placement.py says so on the pod)."""
    meta["labels"] = {**(meta.get("labels") or {}), c.LABEL_PLACEMENT: c.REASON_NO_COMPATIBLE_NODE}
    meta["annotations"] = {**(meta.get("annotations") or {}), c.ANNOTATION_PLACEMENT_MESSAGE: message}
