"""Node restriction of the agents: an agent changes only pods and PodSnapshotContents of its own node, and
only the placement labels of its own Node.

RBAC on Kubernetes 1.20 cannot say "only objects of your node" (no field or label conditions, no
ValidatingAdmissionPolicy), and every agent of the DaemonSet shares one ServiceAccount. The chart gives
each agent a token bound to its own pod (a projected serviceAccountToken): the API server then names
that pod in the request's user info (`authentication.kubernetes.io/pod-name` and `pod-uid`), and this
validating webhook looks the pod up, takes its node, and refuses a change to a pod, or to a content,
of any other node:

  pods, pods/status                               UPDATE only where the pod's spec.nodeName is the agent's
  podsnapshotcontents, podsnapshotcontents/status UPDATE only where the content's node label is the agent's,
                                                  before and after the change; on another node's
                                                  content, only marking its artifact lost (conditions
                                                  Failed/ArtifactLost, Ready false: a restore from it
                                                  failed on this node), nothing else
  nodes                                           UPDATE only of the agent's own Node, and only of its
                                                  placement labels (agent/node_labels.py)

The operator itself may patch Nodes (with placement on) only to remove placement labels of a node whose agent
is gone (operator/stale_placement.py); RBAC cannot narrow a patch to labels, so the nodes hook holds the
operator's own ServiceAccount to that too: a token of it used for anything else of a Node is refused.

An agent is told by who sends the request, never by anything it could change itself: its user name (a
ServiceAccount of the release namespace other than the operator's own; the chart puts nothing else there)
and the pod its token is bound to. Labels on that pod count for nothing (the agent may patch pods, and a pod
it relabelled must not pass as "no agent"); an agent may change no pod of the release namespace at all (its
own included), and a token of such a ServiceAccount that names no pod (the legacy Secret token of 1.20) is
refused, since it cannot be placed on a node. A token whose pod is gone, or has another uid, is refused too
(the API server already rejects tokens of deleted pods; this covers a pod recreated under the same name).
Requests from anyone else pass at once, on the event loop. What this cannot restrict, and why, is in
docs/security.md (reads, Events).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Literal

import kopf

from podsnap import contract as c
from podsnap.kube.client import get_or_none
from podsnap.kube.identity import username_from_token
from podsnap.operator.on_validate import REVIEWS
from podsnap.operator.runtime import OperatorContext, ctx_of, registry

VALIDATE_AGENT_PODS = "validate-agent-pods"
VALIDATE_AGENT_CONTENTS = "validate-agent-contents"
VALIDATE_AGENT_NODES = "validate-agent-nodes"

#: what the API server puts in the user info of a token bound to a pod
EXTRA_POD_NAME = "authentication.kubernetes.io/pod-name"
EXTRA_POD_UID = "authentication.kubernetes.io/pod-uid"
#: the labels of the chart's agent pods (podsnap.labels with component agent), by which agent_absence.py finds the
#: live agents; they never tell this webhook who is an agent (is_agent)
AGENT_LABELS = {"app.kubernetes.io/component": c.COMPONENT_AGENT, "app.kubernetes.io/part-of": "podsnap"}
SA_PREFIX = "system:serviceaccount:"

OPERATIONS: tuple[Literal["UPDATE"]] = ("UPDATE",)

#: refuses (kopf.AdmissionError) a change by the agent of `node`, named `username`, to `body` (was `old`)
Check = Callable[[str, str, Mapping[str, Any], Mapping[str, Any] | None], None]
#: refuses (kopf.AdmissionError) a change by the operator, named `username`, to `body` (was `old`)
OperatorCheck = Callable[[str, Mapping[str, Any], Mapping[str, Any] | None], None]


def _first(values: Any) -> str:
    return str(values[0]) if isinstance(values, list) and values else ""


def own_namespace(ctx: OperatorContext) -> str | None:
    """The operator's namespace (the release's, where the agents run), from its own ServiceAccount."""
    return namespace_of(username_from_token(ctx.credentials.token) or "")


def namespace_of(username: str) -> str | None:
    """The namespace of a ServiceAccount's user name (`system:serviceaccount:<namespace>:<name>`)."""
    parts = username.split(":")
    return parts[2] if len(parts) == 4 and username.startswith(SA_PREFIX) and parts[2] else None


def is_agent(ctx: OperatorContext, username: str) -> bool:
    """Whether a request comes from an agent: from a ServiceAccount of the operator's namespace other than the
    operator's own. That namespace holds podsnap's components alone, so any other ServiceAccount there is
    treated as the agent's (which can only restrict it); whatever such a pod does to its labels changes
    nothing here."""
    namespace = own_namespace(ctx)
    return bool(namespace) and namespace_of(username) == namespace and username != operator_username(ctx)


def agent_node(ctx: OperatorContext, userinfo: Mapping[str, Any]) -> str:
    """The node of the agent that sent this request (is_agent), from the pod its token is bound to.

    Raises kopf.AdmissionError when the token names no pod, or a pod that no longer matches it, or one on no
    node: such a token cannot be placed on a node, so it may change nothing an agent could.
    """
    extra = userinfo.get("extra") or {}
    pod_name, pod_uid = _first(extra.get(EXTRA_POD_NAME)), _first(extra.get(EXTRA_POD_UID))
    username = str(userinfo.get("username") or "")
    namespace = namespace_of(username) or ""
    if not pod_name:
        raise kopf.AdmissionError(
            f"{username} is a ServiceAccount of podsnap's namespace {namespace}, and its token is not bound to a "
            f"pod, so it cannot be placed on a node; the agent uses the token the chart binds to its pod "
            f"(a projected serviceAccountToken)",
            code=403,
        )
    pod = get_or_none(ctx.kube.core.read_namespaced_pod, pod_name, namespace)
    if pod is None or pod.metadata.uid != pod_uid:
        raise kopf.AdmissionError(
            f"{username}: the token is bound to pod {namespace}/{pod_name} (uid {pod_uid}), which no longer "
            f"exists; restart the agent so it reads its new token",
            code=403,
        )
    node = str(pod.spec.node_name or "")
    if not node:
        raise kopf.AdmissionError(
            f"{username}: the token is bound to pod {namespace}/{pod_name}, which is on no node", code=403
        )
    return node


def _refuse(username: str, node: str, what: str, where: str) -> kopf.AdmissionError:
    return kopf.AdmissionError(
        f"{username} is the podsnap agent of node {node} and may not change {what}, which belongs to {where}: "
        f"an agent acts only on its own node's pods and contents",
        code=403,
    )


def check_pod(node: str, username: str, body: Mapping[str, Any], old: Mapping[str, Any] | None) -> None:
    for obj in (old, body):
        if obj is None:
            continue
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        if meta.get("namespace") == namespace_of(username):
            # its own pod among them: relabelled, it could leave its DaemonSet and linger on as a second agent
            raise kopf.AdmissionError(
                f"{username} is the podsnap agent of node {node} and may not change pod {meta.get('namespace')}/"
                f"{meta.get('name')}: the pods of podsnap's own namespace (its agents', the operator's) are no "
                f"agent's to change",
                code=403,
            )
        on = str(spec.get("nodeName") or "")
        if on != node:
            what = f"pod {meta.get('namespace')}/{meta.get('name')}"
            raise _refuse(username, node, what, f"node {on}" if on else "no node (not scheduled)")


def _conditions(obj: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {str(cond.get("type")): cond for cond in (obj.get("status") or {}).get("conditions") or []}


def _all_but_conditions(obj: Mapping[str, Any]) -> tuple[Any, ...]:
    meta, status = obj.get("metadata") or {}, dict(obj.get("status") or {})
    status.pop("conditions", None)
    keep = ("labels", "annotations", "finalizers", "ownerReferences", "deletionTimestamp")
    return obj.get("spec"), status, *(meta.get(key) for key in keep)


def only_marks_lost(body: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
    """Whether the change only marks the content's artifact unusable (Failed/ArtifactLost, Ready false):
    what an agent that failed to restore from another node's artifact writes (podsnap.agent.artifacts)."""
    if old is None or _all_but_conditions(old) != _all_but_conditions(body):
        return False
    before, after = _conditions(old), _conditions(body)
    changed = [after.get(kind) for kind in set(before) | set(after) if before.get(kind) != after.get(kind)]
    if any(cond is None or cond.get("reason") != c.REASON_ARTIFACT_LOST for cond in changed):
        return False
    ready, failed = after.get(c.COND_READY) or {}, after.get(c.COND_FAILED) or {}
    return ready.get("status") != "True" and failed.get("status") == "True"


def check_content(node: str, username: str, body: Mapping[str, Any], old: Mapping[str, Any] | None) -> None:
    for obj in (old, body):
        if obj is None:
            continue
        meta = obj.get("metadata") or {}
        on = str((meta.get("labels") or {}).get(c.LABEL_SNAPSHOT_NODE) or "")
        if on != node and not only_marks_lost(body, old):
            what = f"PodSnapshotContent {meta.get('name')}"
            raise _refuse(username, node, what, f"node {on}" if on else "no node")


#: what of a Node an agent may change: nothing but its placement labels (and the bookkeeping the API server
#: does); its status is not compared (a Node's status changes only through nodes/status, which it may not write)
_NODE_BOOKKEEPING = ("managedFields", "resourceVersion", "generation")


def _all_but_placement(node: Mapping[str, Any]) -> tuple[Any, ...]:
    meta = {k: v for k, v in (node.get("metadata") or {}).items() if k not in _NODE_BOOKKEEPING}
    meta["labels"] = {k: v for k, v in (meta.get("labels") or {}).items() if k not in c.NODE_FACT_LABELS}
    return meta, node.get("spec") or {}


def check_node(node: str, username: str, body: Mapping[str, Any], old: Mapping[str, Any] | None) -> None:
    """An agent labels its own Node with its placement facts (agent/node_labels.py), and changes nothing else
    of any Node: no other label (one that would attract other workloads), no taint, no other node."""
    name = str((body.get("metadata") or {}).get("name") or "")
    if name != node:
        raise _refuse(username, node, f"Node {name}", f"node {name}")
    if old is not None and _all_but_placement(old) != _all_but_placement(body):
        raise kopf.AdmissionError(
            f"{username} is the podsnap agent of node {node} and may change only its Node's placement labels "
            f"({', '.join(c.NODE_FACT_LABELS)}), nothing else of it",
            code=403,
        )


def check_operator_node(username: str, body: Mapping[str, Any], old: Mapping[str, Any] | None) -> None:
    """The operator changes a Node only by removing placement labels (operator/stale_placement.py)."""
    if old is None:
        return

    def placement(node: Mapping[str, Any]) -> dict[str, Any]:
        labels = (node.get("metadata") or {}).get("labels") or {}
        return {k: v for k, v in labels.items() if k in c.NODE_FACT_LABELS}

    before, after = placement(old), placement(body)
    if _all_but_placement(old) != _all_but_placement(body) or any(before.get(k) != v for k, v in after.items()):
        raise kopf.AdmissionError(
            f"{username} is the podsnap operator and may only remove podsnap's placement labels of a Node "
            f"({', '.join(c.NODE_FACT_LABELS)}), nothing else of it",
            code=403,
        )


def operator_username(ctx: OperatorContext) -> str | None:
    """The user the operator's own requests come as (its ServiceAccount)."""
    return username_from_token(ctx.credentials.token)


#: the object as stored, in place of the request's oldObject
Stored = Callable[[OperatorContext, Mapping[str, Any]], Mapping[str, Any] | None]


def stored_node(ctx: OperatorContext, body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The Node as the API server stores it: the change is found against this, because the oldObject of an
    agent's Node patch was seen to carry the patched labels already (1.20 API server, kopf 1.37;
    tests/operator/test_agent_node.py then let a foreign label through)."""
    # raw JSON, as the admission request spells it (the client's models would respell the timestamps)
    raw = get_or_none(ctx.kube.core.read_node, (body.get("metadata") or {}).get("name"), _preload_content=False)
    return None if raw is None else dict(json.loads(raw.data))


async def _validate(
    check: Check,
    body: kopf.Body,
    old: Mapping[str, Any] | None,
    userinfo: Mapping[str, Any],
    memo: Any,
    *,
    stored: Stored | None = None,
    operator_check: OperatorCheck | None = None,
) -> None:
    ctx = ctx_of(memo)
    loop = asyncio.get_running_loop()
    username = str(userinfo.get("username") or "")
    if operator_check is not None and username and username == operator_username(ctx):
        if stored is not None:
            old = await loop.run_in_executor(REVIEWS, stored, ctx, body)
        operator_check(username, body, old)
        return
    if not is_agent(ctx, username):
        return  # answered on the event loop
    node = await loop.run_in_executor(REVIEWS, agent_node, ctx, userinfo)
    if stored is not None:
        old = await loop.run_in_executor(REVIEWS, stored, ctx, body)
    check(node, str(userinfo.get("username")), body, old)


def _handler(
    check: Check, stored: Stored | None = None, operator_check: OperatorCheck | None = None
) -> Callable[..., Coroutine[Any, Any, None]]:
    async def validate(
        *, body: kopf.Body, old: kopf.Body | None, userinfo: Mapping[str, Any], memo: Any, **_: Any
    ) -> None:
        await _validate(check, body, old, userinfo, memo, stored=stored, operator_check=operator_check)

    return validate


validate_agent_pods = kopf.on.validate(
    "", "v1", "pods", id=VALIDATE_AGENT_PODS, operations=OPERATIONS, subresource="*", registry=registry
)(_handler(check_pod))
validate_agent_contents = kopf.on.validate(
    c.GROUP,
    c.VERSION,
    c.PLURAL_POD_SNAPSHOT_CONTENTS,
    id=VALIDATE_AGENT_CONTENTS,
    operations=OPERATIONS,
    subresource="*",
    registry=registry,
)(_handler(check_content))
validate_agent_nodes = kopf.on.validate(
    "", "v1", "nodes", id=VALIDATE_AGENT_NODES, operations=OPERATIONS, registry=registry
)(_handler(check_node, stored_node, check_operator_node))
