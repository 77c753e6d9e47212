"""Placement labels of a node that runs no agent any more are removed, so no restore pod is sent there.

An agent labels its own Node with the facts the restore gates compare (agent/node_labels.py), and the pod
webhook requires them of a restore pod's node (placement.py). When the agent is taken off a node (the
DaemonSet's nodeSelector or tolerations changed, a taint evicted it), nothing would remove them: restore pods
would still be sent to a node where no agent will ever restore them, and wait there for its pickup timeout.

So the operator removes podsnap's placement labels (and nothing else) from a Node that has no agent pod and
has had no Ready agent for `cleanup.handoverAfterSeconds` (agent_absence.py: counted from the kubelet's or
the operator's own record, so an operator restart does not start the wait again). Why this, and not a label
the affinity also requires that only a running agent keeps:
- the webhook's check that some Ready node can take a pod (placement.unmatched) reads the same labels, so the
  pod is told at once that no node can take it (NoCompatibleNode: cold start, or Pending under Fail) instead of
  being scheduled onto a dead end;
- a liveness label would have to be removed when the agent stops, and an agent cannot tell a rolling update
  (a new agent in seconds) from its removal: every update would send restore pods elsewhere or cold;
- the wait rides out agent restarts and updates, and a node whose agent pod exists (even not Ready: it may be
  crash-looping or starting) keeps its labels, since that agent relabels its node whenever it runs.
An agent that comes back labels its Node again when it starts.

The patch carries the Node's resourceVersion: an agent that relabelled the node in between wins (409), and
the next sweep looks again. RBAC cannot narrow the operator's Node patch to these labels; this module is the
only code that patches Nodes, and the nodes hook refuses the operator's ServiceAccount any other Node change
(on_agent_requests.py, docs/security.md).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes.client.exceptions import ApiException

from podsnap import contract as c
from podsnap.kube.events import cluster_event
from podsnap.operator.agent_absence import Agents
from podsnap.operator.runtime import OperatorContext

#: Event on a Node: the operator removed the placement labels of its absent agent
REASON_PLACEMENT_LABELS_REMOVED = "PlacementLabelsRemoved"


def name_of(node: Mapping[str, Any]) -> str:
    return str((node.get("metadata") or {}).get("name") or "")


def labelled_nodes(ctx: OperatorContext) -> list[dict[str, Any]]:
    """Nodes carrying any of podsnap's placement labels (one selector per label: only labelled nodes are
    listed, which on a large cluster are few of them)."""
    found: dict[str, dict[str, Any]] = {}
    for label in c.NODE_FACT_LABELS:
        for node in ctx.kube.core.list_node(label_selector=label).items:
            body = ctx.kube.sanitize(node)
            found[name_of(body)] = body
    return [found[name] for name in sorted(found)]


def stale(
    labelled: Sequence[Mapping[str, Any]],
    agents: Agents,
    absent: Mapping[str, datetime.datetime],
    now: datetime.datetime,
    wait_s: float,
) -> list[Mapping[str, Any]]:
    """Of the `labelled` nodes, those with no agent pod whose recorded absence is at least `wait_s` old."""
    out = []
    for node in labelled:
        name = name_of(node)
        since = absent.get(name)
        if name not in agents.present and since is not None and (now - since).total_seconds() >= wait_s:
            out.append(node)
    return out


def remove_labels(ctx: OperatorContext, node: Mapping[str, Any], logger: Any) -> bool:
    """Remove the placement labels of `node` (as last read); False when the Node changed in between (an agent
    came back and labelled it): the next sweep decides again."""
    meta = node.get("metadata") or {}
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if k in c.NODE_FACT_LABELS}
    if not labels:
        return False
    patch = {"metadata": {"resourceVersion": meta.get("resourceVersion"), "labels": dict.fromkeys(labels)}}
    try:
        ctx.kube.core.patch_node(meta["name"], patch)
    except ApiException as exc:
        if exc.status != 409:
            raise
        return False
    wait = ctx.config.cleanup_handover_s
    removed = ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))
    message = (
        f"node {meta['name']} has had no podsnap agent for at least {wait} s (cleanup.handoverAfterSeconds): "
        f"removed its placement labels ({removed}), so restore pods are no longer sent here; an agent that "
        f"runs here again labels the node again"
    )
    node_obj = {"apiVersion": "v1", "kind": "Node", **node}
    cluster_event(ctx.kube.core, node_obj, type_="Normal", reason=REASON_PLACEMENT_LABELS_REMOVED, message=message)
    logger.warning("%s", message)
    return True
