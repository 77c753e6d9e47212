"""Artifacts whose node's agent cannot remove them: a PodSnapshotContent being deleted whose node is gone,
or whose node has had no Ready agent for `cleanup.handoverAfterSeconds`, is handed to the agent of
another node, which removes the artifact and then the content's finalizer. That wait counts from when the
node last had a Ready agent (agent_absence.py), not from the content's deletion: a content deleted long
after its agent went is handed over at once, one deleted just before an agent's blip is not handed over
during the blip, and nothing is handed over while the node has a Ready agent.

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

The relabel carries the resourceVersion the decision was made on: if anything changed the content since
(its own agent came back and acted, a second operator handed it over), the API server refuses it with a
409 and nothing is done twice; that change's own event, or the next sweep, decides again on the new state.

Checked on each content event and every SWEEP_S by a loop the operator starts (a wait that ends fires no
event; timers would put the operator's finalizer on the contents). The same loop keeps the record of
absent agents (agent_absence.py) and removes stale placement labels (stale_placement.py).
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
from podsnap.kube.events import cluster_event
from podsnap.operator import agent_absence, stale_placement
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
    *, name: str, node: str, node_exists: bool, agent_on_node: bool, live: Sequence[str], absent_s: float, wait_s: float
) -> Decision:
    """What to do with content `name` of `node`, being deleted, whose node has had no Ready agent for
    `absent_s` (0 while it has one); `live`: nodes with a Ready agent."""
    if agent_on_node:  # never while the node has a Ready agent, even one whose Node object is gone
        return Decision()
    gone = f"node {node} is gone" if not node_exists else f"node {node} has had no running agent for {absent_s:.0f} s"
    others = [n for n in live if n != node]
    if others and (not node_exists or absent_s >= wait_s):
        return Decision(to=pick(name, others), why=gone)
    if absent_s >= wait_s:
        return Decision(release=True, why=f"{gone}, and no node has a running agent")
    return Decision()


def node_of(content: Mapping[str, Any]) -> str:
    meta = content.get("metadata") or {}
    return str(
        (meta.get("labels") or {}).get(c.LABEL_SNAPSHOT_NODE) or (content.get("spec") or {}).get("nodeName") or ""
    )


def collect(
    ctx: OperatorContext,
    body: Mapping[str, Any],
    logger: Any,
    seen: tuple[agent_absence.Agents, Mapping[str, datetime.datetime]] | None = None,
) -> Decision | None:
    """Hand over (or release) content `body` if it is being deleted and its node's agent cannot finish it.
    `seen`: the agent pods and recorded absences, when the caller (the sweep) has them already."""
    meta = body.get("metadata") or {}
    if not meta.get("deletionTimestamp") or c.FINALIZER_CONTENT_ARTIFACT not in (meta.get("finalizers") or []):
        return None
    node = node_of(body)
    node_exists = bool(node) and get_or_none(ctx.kube.core.read_node, node) is not None
    agents, recorded = seen if seen is not None else (agent_absence.observe(ctx), agent_absence.read(ctx)[0])
    now = datetime.datetime.now(datetime.UTC)
    absent_s = (now - agent_absence.since(node, agents, recorded, now)).total_seconds()
    decision = decide(
        name=str(meta.get("name")),
        node=node,
        node_exists=node_exists,
        agent_on_node=node in agents.ready,
        live=sorted(agents.ready),
        absent_s=absent_s,
        wait_s=ctx.config.cleanup_handover_s,
    )
    if decision.to is not None:
        hand_over(ctx, body, node, decision, logger)
    elif decision.release:
        release(ctx, body, decision.why, logger)
    return decision


def hand_over(ctx: OperatorContext, body: Mapping[str, Any], node: str, decision: Decision, logger: Any) -> None:
    """Relabel content `body` to `decision.to`, only if it is still as `body` shows it (its resourceVersion):
    raises kopf.TemporaryError when it changed in between, and nothing is handed over."""
    name = body["metadata"]["name"]
    patch = {
        "metadata": {
            "resourceVersion": body["metadata"]["resourceVersion"],
            "labels": {c.LABEL_SNAPSHOT_NODE: decision.to},
            "annotations": {c.ANNOTATION_HANDED_OVER_FROM: node},
        }
    }
    try:
        ctx.kube.custom.patch_cluster_custom_object(c.GROUP, c.VERSION, c.PLURAL_POD_SNAPSHOT_CONTENTS, name, patch)
    except ApiException as exc:
        if exc.status != 409:
            raise
        # its agent or another operator changed it since this decision: decide again on what it is now
        raise kopf.TemporaryError(
            f"{name} changed while being handed over to node {decision.to}; deciding again", delay=1
        ) from exc
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
    """An Event on content `body` (cluster-scoped: in `default`, so `message` must name no namespace)."""
    content = {"apiVersion": c.API_VERSION, "kind": c.KIND_POD_SNAPSHOT_CONTENT, **body}
    cluster_event(ctx.kube.core, content, type_=type_, reason=reason, message=message)


def sweep(ctx: OperatorContext, logger: Any) -> None:
    found = ctx.kube.custom.list_cluster_custom_object(c.GROUP, c.VERSION, c.PLURAL_POD_SNAPSHOT_CONTENTS)
    contents = found.get("items") or []
    agents = agent_absence.observe(ctx)
    labelled = stale_placement.labelled_nodes(ctx) if ctx.config.placement else []
    # the nodes whose absence matters: those holding contents (a deletion may come), those with placement labels
    # (stale_placement.py), those with an agent pod (it may be not Ready)
    watched = (
        {node_of(content) for content in contents} | agents.present | {stale_placement.name_of(n) for n in labelled}
    )
    now = datetime.datetime.now(datetime.UTC)
    absent = agent_absence.track(ctx, agents, watched - {""}, now)
    for content in contents:
        if (content.get("metadata") or {}).get("deletionTimestamp"):
            try:
                collect(ctx, content, logger, (agents, absent))
            except Exception as exc:  # one content's API error must not end the loop
                logger.warning("could not check %s for a handover: %s", content["metadata"].get("name"), exc)
    for node in stale_placement.stale(labelled, agents, absent, now, ctx.config.cleanup_handover_s):
        try:
            stale_placement.remove_labels(ctx, node, logger)
        except Exception as exc:  # likewise for one node
            logger.warning("could not remove the placement labels of node %s: %s", stale_placement.name_of(node), exc)


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
