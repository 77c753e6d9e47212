"""Node restriction of the agents: an agent changes only pods and PodSnapshotContents of its own node.

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

A token whose pod is gone, or has another uid, is refused too (the API server already rejects tokens of
deleted pods; this covers a pod recreated under the same name). Requests from anyone else pass at once,
on the event loop. What this cannot restrict, and why, is in docs/security.md (reads, Events).
"""

from __future__ import annotations

import asyncio
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

#: what the API server puts in the user info of a token bound to a pod
EXTRA_POD_NAME = "authentication.kubernetes.io/pod-name"
EXTRA_POD_UID = "authentication.kubernetes.io/pod-uid"
#: the agent's pods carry these (the chart's podsnap.labels with component agent)
AGENT_LABELS = {"app.kubernetes.io/component": c.COMPONENT_AGENT, "app.kubernetes.io/part-of": "podsnap"}

OPERATIONS: tuple[Literal["UPDATE"]] = ("UPDATE",)

#: refuses (kopf.AdmissionError) a change by the agent of `node`, named `username`, to `body` (was `old`)
Check = Callable[[str, str, Mapping[str, Any], Mapping[str, Any] | None], None]


def _first(values: Any) -> str:
    return str(values[0]) if isinstance(values, list) and values else ""


def own_namespace(ctx: OperatorContext) -> str | None:
    """The operator's namespace (the release's, where the agents run), from its own ServiceAccount."""
    parts = (username_from_token(ctx.credentials.token) or "").split(":")
    return parts[2] if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"] else None


def agent_node(ctx: OperatorContext, userinfo: Mapping[str, Any]) -> str | None:
    """The node of the agent that sent this request; None when the requester is not a podsnap agent.

    Raises kopf.AdmissionError for an agent's token whose pod no longer matches it.
    """
    extra = userinfo.get("extra") or {}
    pod_name, pod_uid = _first(extra.get(EXTRA_POD_NAME)), _first(extra.get(EXTRA_POD_UID))
    namespace = own_namespace(ctx)
    username = str(userinfo.get("username") or "")
    if not pod_name or not namespace or not username.startswith(f"system:serviceaccount:{namespace}:"):
        return None
    pod = get_or_none(ctx.kube.core.read_namespaced_pod, pod_name, namespace)
    if pod is None or pod.metadata.uid != pod_uid:
        raise kopf.AdmissionError(
            f"{username}: the token is bound to pod {namespace}/{pod_name} (uid {pod_uid}), which no longer "
            f"exists; restart the agent so it reads its new token",
            code=403,
        )
    labels = pod.metadata.labels or {}
    if any(labels.get(key) != value for key, value in AGENT_LABELS.items()):
        return None
    return str(pod.spec.node_name or "") or None


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


async def _validate(
    check: Check, body: kopf.Body, old: kopf.Body | None, userinfo: Mapping[str, Any], memo: Any
) -> None:
    extra = userinfo.get("extra") or {}
    if not extra.get(EXTRA_POD_NAME):
        return  # not a token bound to a pod: no agent of the chart's (answered on the event loop)
    ctx = ctx_of(memo)
    node = await asyncio.get_running_loop().run_in_executor(REVIEWS, agent_node, ctx, userinfo)
    if node is None:
        return
    check(node, str(userinfo.get("username")), body, old)


def _handler(check: Check) -> Callable[..., Coroutine[Any, Any, None]]:
    async def validate(
        *, body: kopf.Body, old: kopf.Body | None, userinfo: Mapping[str, Any], memo: Any, **_: Any
    ) -> None:
        await _validate(check, body, old, userinfo, memo)

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
