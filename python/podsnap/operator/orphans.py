"""Artifacts whose node's agent cannot remove them: a PodSnapshotContent being deleted whose node is gone,
or whose node has had no running agent for `cleanup.handoverAfterSeconds`, is handed to the agent of
another node, which removes the artifact and then the content's finalizer.

The handover is a relabel: the operator sets the content's node label (what each agent's watch selects
on) to a node with a Ready agent. Why this and not an orphan sweep in every agent:
- exactly one agent acts, with no coordination among agents: the label names one node;
- the content's finalizer holds the content until its artifact is really gone, so the deletion is
  observable and retried like any other; a sweep could only delete files that nothing accounts for;
- a sweep would have to tell an orphan from an artifact whose content it has not seen yet (a content
  exists before its capture publishes) and from captures in flight on other nodes;
- the agents' node restriction (on_agent_requests.py) keeps holding: the receiving agent changes only a
  content labelled with its own node.
Where no agent runs anywhere for that long, the content is released and the Event names the path left
(ArtifactLeftBehind), so that a deletion never hangs forever.

Checked on each content event and every SWEEP_S by a loop the operator starts (a wait that ends fires no
event; timers would put the operator's finalizer on the contents).
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime
import hashlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from podsnap import contract as c
from podsnap.kube.client import get_or_none
from podsnap.kube.conditions import now_rfc3339, parse_time, short
from podsnap.kube.events import EVENT_MESSAGE_MAX
from podsnap.operator.on_agent_requests import AGENT_LABELS, own_namespace
from podsnap.operator.runtime import OperatorContext, ctx_of, registry

log = logging.getLogger(__name__)

#: how often the loop looks at the contents being deleted
SWEEP_S = 10.0
REASON_ARTIFACT_LEFT = "ArtifactLeftBehind"
#: Event on a content: its deletion went to another node's agent
REASON_HANDED_OVER = "ArtifactHandedOver"


@dataclass(frozen=True)
class Decision:
    """`to`: the node whose agent now removes the artifact; `release`: drop the finalizer, the artifact is
    left; neither: wait (the node's own agent owns the cleanup, or may still come back)."""

    to: str | None = None
    release: bool = False
    why: str = ""


def pick(name: str, nodes: Sequence[str]) -> str:
    """One of `nodes` for content `name`, the same every time, spread over nodes by the name."""
    ordered = sorted(nodes)
    return ordered[int(hashlib.sha256(name.encode()).hexdigest(), 16) % len(ordered)]


def decide(
    *, name: str, node: str, node_exists: bool, agent_on_node: bool, live: Sequence[str], waited_s: float, wait_s: float
) -> Decision:
    """What to do with content `name` of `node`, being deleted for `waited_s`; `live`: nodes with a Ready agent."""
    if node_exists and agent_on_node:
        return Decision()
    gone = f"node {node} is gone" if not node_exists else f"node {node} has had no running agent for {waited_s:.0f} s"
    others = [n for n in live if n != node]
    if others and (not node_exists or waited_s >= wait_s):
        return Decision(to=pick(name, others), why=gone)
    if waited_s >= wait_s:
        return Decision(release=True, why=f"{gone}, and no node has a running agent")
    return Decision()


def live_agent_nodes(ctx: OperatorContext) -> list[str]:
    """Nodes with a Ready podsnap agent (the release's agent pods, in the operator's namespace)."""
    namespace = own_namespace(ctx)
    if namespace is None:
        return []
    selector = ",".join(f"{k}={v}" for k, v in sorted(AGENT_LABELS.items()))
    pods = ctx.kube.core.list_namespaced_pod(namespace, label_selector=selector).items
    nodes = set()
    for pod in pods:
        ready = any(
            cond.type == "Ready" and cond.status == "True" for cond in (pod.status and pod.status.conditions) or []
        )
        if ready and pod.spec.node_name and pod.metadata.deletion_timestamp is None:
            nodes.add(str(pod.spec.node_name))
    return sorted(nodes)


def collect(ctx: OperatorContext, body: Mapping[str, Any], logger: Any) -> Decision | None:
    """Hand over (or release) content `body` if it is being deleted and its node's agent cannot finish it."""
    meta = body.get("metadata") or {}
    if not meta.get("deletionTimestamp") or c.FINALIZER_CONTENT_ARTIFACT not in (meta.get("finalizers") or []):
        return None
    node = str((meta.get("labels") or {}).get(c.LABEL_SNAPSHOT_NODE) or (body.get("spec") or {}).get("nodeName") or "")
    node_exists = bool(node) and get_or_none(ctx.kube.core.read_node, node) is not None
    live = live_agent_nodes(ctx)
    since = parse_time(meta.get("deletionTimestamp"))
    now = datetime.datetime.now(datetime.UTC)
    waited = (now - since).total_seconds() if since is not None else 0.0
    decision = decide(
        name=str(meta.get("name")),
        node=node,
        node_exists=node_exists,
        agent_on_node=node in live,
        live=live,
        waited_s=waited,
        wait_s=ctx.config.cleanup_handover_s,
    )
    if decision.to is not None:
        hand_over(ctx, body, node, decision, logger)
    elif decision.release:
        release(ctx, body, decision.why, logger)
    return decision


def hand_over(ctx: OperatorContext, body: Mapping[str, Any], node: str, decision: Decision, logger: Any) -> None:
    name = body["metadata"]["name"]
    patch = {
        "metadata": {
            "labels": {c.LABEL_SNAPSHOT_NODE: decision.to},
            "annotations": {c.ANNOTATION_HANDED_OVER_FROM: node},
        }
    }
    ctx.kube.custom.patch_cluster_custom_object(c.GROUP, c.VERSION, c.PLURAL_POD_SNAPSHOT_CONTENTS, name, patch)
    message = f"{decision.why}: the agent of node {decision.to} removes this content's artifact"
    post_event(ctx, body, "Normal", REASON_HANDED_OVER, message)
    logger.warning("%s: %s", name, message)


def release(ctx: OperatorContext, body: Mapping[str, Any], why: str, logger: Any) -> None:
    """No agent can remove the artifact: let the deletion finish, and say where the artifact was left."""
    meta, spec = body["metadata"], body.get("spec") or {}
    if spec.get("artifactPath") and spec.get("deletionPolicy", c.DELETION_POLICY_DELETE) == c.DELETION_POLICY_DELETE:
        message = (
            f"{why}, so no agent removed artifact {spec['artifactPath']} from the artifact volume; remove it by hand"
        )
        # the path names the snapshot's namespace: the log has it, the Event (in `default`) does not
        public = f"{why}, so no agent removed this content's artifact; its path is in the operator's log"
        post_event(ctx, body, "Warning", REASON_ARTIFACT_LEFT, public)
        logger.warning("%s", message)
    remove_finalizer(ctx, meta["name"], c.FINALIZER_CONTENT_ARTIFACT)
    logger.warning("finalized %s: %s", meta["name"], why)


def remove_finalizer(ctx: OperatorContext, name: str, finalizer: str) -> None:
    """Remove one finalizer from a content, guarded by resourceVersion and retried on conflicts."""
    for _ in range(5):
        obj = ctx.kube.get_cr(c.PLURAL_POD_SNAPSHOT_CONTENTS, name)
        if obj is None or finalizer not in (obj["metadata"].get("finalizers") or []):
            return
        rest = [f for f in obj["metadata"]["finalizers"] if f != finalizer]
        try:
            ctx.kube.custom.patch_cluster_custom_object(
                c.GROUP,
                c.VERSION,
                c.PLURAL_POD_SNAPSHOT_CONTENTS,
                name,
                [
                    {"op": "test", "path": "/metadata/resourceVersion", "value": obj["metadata"]["resourceVersion"]},
                    {"op": "replace", "path": "/metadata/finalizers", "value": rest},
                ],
                _content_type="application/json-patch+json",
            )
            return
        except ApiException as exc:
            if exc.status not in (409, 422) or "test" not in str(exc.body):
                raise
    raise kopf.TemporaryError(f"{name}: finalizers kept changing; retrying", delay=1)


def post_event(ctx: OperatorContext, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    """An Event on content `body` (cluster-scoped: in `default`, so `message` must name no namespace), posted
    through the API: the sweep runs outside kopf's handlers, where kopf.event has no queue."""
    meta = body.get("metadata") or {}
    now = now_rfc3339()
    ev = {
        "metadata": {"generateName": f"{meta.get('name')}.", "namespace": "default"},
        "involvedObject": {
            "apiVersion": c.API_VERSION,
            "kind": c.KIND_POD_SNAPSHOT_CONTENT,
            "name": meta.get("name"),
            "uid": meta.get("uid"),
        },
        "type": type_,
        "reason": reason,
        "message": short(message, EVENT_MESSAGE_MAX),
        "source": {"component": "podsnap-operator"},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        ctx.kube.core.create_namespaced_event("default", ev)
    except Exception as exc:  # an Event is best-effort by nature
        log.warning("could not post event %s on %s: %s", reason, meta.get("name"), exc)


def sweep(ctx: OperatorContext, logger: Any) -> None:
    found = ctx.kube.custom.list_cluster_custom_object(c.GROUP, c.VERSION, c.PLURAL_POD_SNAPSHOT_CONTENTS)
    for content in found.get("items") or []:
        if (content.get("metadata") or {}).get("deletionTimestamp"):
            try:
                collect(ctx, content, logger)
            except Exception as exc:  # one content's API error must not end the loop
                logger.warning("could not check %s for a handover: %s", content["metadata"].get("name"), exc)


async def sweep_loop(ctx: OperatorContext, logger: Any, interval_s: float = SWEEP_S) -> None:
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(interval_s)
        try:
            # in this task's context (kopf's settings, made when the startup handler created it): Events need it
            await loop.run_in_executor(None, contextvars.copy_context().run, sweep, ctx, logger)
        except Exception as exc:  # the API may be away for a while; the next round retries
            logger.warning("orphaned-artifact sweep failed: %s", exc)


@kopf.on.startup(registry=registry)
async def start_sweep(*, memo: Any, logger: kopf.Logger, **_: Any) -> None:
    ctx = ctx_of(memo)
    ctx.background.append(asyncio.create_task(sweep_loop(ctx, logger, min(SWEEP_S, ctx.config.cleanup_handover_s))))


@kopf.on.cleanup(registry=registry)
async def stop_sweep(*, memo: Any, **_: Any) -> None:
    for task in ctx_of(memo).background:
        task.cancel()
