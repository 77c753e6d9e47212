"""Pods the webhook could not place (operator/placement.py) say so once they exist: the webhook answers
before the pod has a name or uid, so it marks the pod, and this handler (watching only marked pods, by a
server-side label selector) writes the Restored condition and a Warning Event:

  ColdStart  Restored=False, reason FellBackToColdStart, message "NoCompatibleNode: no Ready node has ..."
             (the pod was left unshaped and runs its command cold), as a refused restore's fallback says it
  Fail       Restored=False, reason NoCompatibleNode; the pod keeps its node affinity and stays Pending
             until a node with the checkpoint's facts is Ready (its agent then restores it)

Once the pod has a Restored condition (this one, or the agent's when it restores) nothing more is written.
"""

from __future__ import annotations

from typing import Any

import kopf

from podsnap import contract as c
from podsnap.kube import conditions
from podsnap.kube.conditions import Condition
from podsnap.kube.reporter import pod_condition, report
from podsnap.operator.runtime import ctx_of, registry


def verdict(pod: dict[str, Any]) -> Condition:
    annotations = pod["metadata"].get("annotations") or {}
    message = annotations.get(c.ANNOTATION_PLACEMENT_MESSAGE) or "no Ready node carries the checkpoint's facts"
    if c.ANNOTATION_RESTORE_FROM in annotations:  # shaped, so restoreFailurePolicy Fail
        held = f"{message} (restoreFailurePolicy Fail: the pod stays Pending until such a node is Ready)"
        return Condition(c.POD_CONDITION_RESTORED, False, c.REASON_NO_COMPATIBLE_NODE, held)
    cold = f"{c.REASON_NO_COMPATIBLE_NODE}: {message}"
    return Condition(c.POD_CONDITION_RESTORED, False, c.REASON_FELL_BACK_TO_COLD_START, cold)


@kopf.on.event("", "v1", "pods", labels={c.LABEL_PLACEMENT: c.REASON_NO_COMPATIBLE_NODE}, registry=registry)
def no_compatible_node(*, body: kopf.Body, type: str | None, memo: Any, **_: Any) -> None:
    ctx = ctx_of(memo)
    meta = body.get("metadata") or {}
    uid = str(meta.get("uid"))
    if type == "DELETED":
        ctx.placement_noticed.discard(uid)
        return
    said = conditions.find((body.get("status") or {}).get("conditions"), c.POD_CONDITION_RESTORED)
    # an event that arrived before this handler's own write still shows no condition: the uid tells
    if said is not None or uid in ctx.placement_noticed or meta.get("deletionTimestamp"):
        return
    pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", **dict(body)}
    report(pod, verdict(pod), write=pod_condition(ctx.kube, pod), warning=True)
    ctx.placement_noticed.add(uid)
