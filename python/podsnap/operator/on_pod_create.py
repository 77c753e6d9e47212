"""The pod-create webhook: pods of a SnapshotPolicy whose checkpoint is Ready (for the pod's own template)
are shaped for restore; every other pod passes untouched. The webhook configuration's failurePolicy is
Ignore, so an outage means a cold start, never a blocked rollout."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from podsnap import contract as c
from podsnap.operator.config import WEBHOOK_PATH_ID
from podsnap.operator.kube import Kube, get_or_none
from podsnap.operator.policy import TARGET_KINDS, template_hash
from podsnap.operator.restore_pod import NotShapeable, shape
from podsnap.operator.runtime import OperatorContext, ctx_of, registry


@dataclass(frozen=True)
class Owner:
    kind: str
    name: str
    template: Mapping[str, Any]


def controller_of(meta: Mapping[str, Any]) -> Mapping[str, Any] | None:
    return next((r for r in meta.get("ownerReferences") or [] if r.get("controller")), None)


def find_owner(kube: Kube, pod: Mapping[str, Any], namespace: str) -> Owner | None:
    """The Deployment or StatefulSet behind a new pod, with the template the pod was made from."""
    ref = controller_of(pod.get("metadata") or {})
    if ref is None:
        return None
    if ref.get("kind") == "StatefulSet":
        sts = get_or_none(kube.apps.read_namespaced_stateful_set, ref["name"], namespace)
        return None if sts is None else Owner("StatefulSet", ref["name"], kube.sanitize(sts.spec.template))
    if ref.get("kind") != "ReplicaSet":
        return None
    rs = get_or_none(kube.apps.read_namespaced_replica_set, ref["name"], namespace)
    if rs is None:
        return None
    rs_body = kube.sanitize(rs)
    dep = controller_of(rs_body["metadata"])
    if dep is None or dep.get("kind") != "Deployment":
        return None
    # the ReplicaSet's template is the Deployment template this pod was made from (plus pod-template-hash,
    # which template_hash ignores), so a pod of an older rollout never restores a newer template's checkpoint
    return Owner("Deployment", dep["name"], rs_body["spec"]["template"])


@dataclass(frozen=True)
class Plan:
    """`restore` from `snapshot` into `container`, or `wait` (WaitForCheckpoint, checkpoint not Ready)."""

    action: str
    snapshot: str = ""
    container: str = ""


def restore_plan(ctx: OperatorContext, pod: Mapping[str, Any], namespace: str) -> Plan | None:
    """What to do with a new pod; None leaves it untouched (a cold start)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if c.ANNOTATION_RESTORE_FROM in annotations:
        return None  # shaped already, or a hand-made restore pod: leave it as its author wrote it
    owner = find_owner(ctx.kube, pod, namespace)
    if owner is None or owner.kind not in TARGET_KINDS:
        return None
    policies = ctx.kube.custom.list_namespaced_custom_object(c.GROUP, c.VERSION, namespace, c.PLURAL_SNAPSHOT_POLICIES)
    for policy in policies.get("items", []):
        ref = (policy.get("spec") or {}).get("targetRef") or {}
        if ref.get("kind") != owner.kind or ref.get("name") != owner.name:
            continue
        status, spec = policy.get("status") or {}, policy.get("spec") or {}
        current = status.get("templateHash") == template_hash(owner.template)
        if status.get("ready") and status.get("checkpointName") and current:
            return Plan("restore", status["checkpointName"], spec.get("targetContainerName") or "main")
        if spec.get("startupPolicy") == c.STARTUP_POLICY_WAIT:
            return Plan("wait")
        ctx.metrics.pods_cold.labels("TemplateChanged" if status.get("ready") else "CheckpointNotReady").inc()
        return None
    return None


def hold(ctx: OperatorContext, pod: Mapping[str, Any], patch: kopf.Patch) -> None:
    """WaitForCheckpoint: this pod must not start before the checkpoint is Ready. With scheduling gates the
    gate holds it; without (Kubernetes < 1.27) a node selector no node matches does. Either way the
    operator's replica hold then scales it away, and pods made after Ready restore."""
    if ctx.scheduling_gates:
        gates = list((pod.get("spec") or {}).get("schedulingGates") or [])
        patch.spec["schedulingGates"] = [*gates, {"name": c.SCHEDULING_GATE_WAIT}]
    else:
        selector = dict((pod.get("spec") or {}).get("nodeSelector") or {})
        patch.spec["nodeSelector"] = {**selector, c.SCHEDULING_GATE_WAIT: "true"}


@kopf.on.mutate("", "v1", "pods", operations=["CREATE"], id=WEBHOOK_PATH_ID, registry=registry, ignore_failures=True)
def mutate_pod(
    *, body: kopf.Body, namespace: str | None, patch: kopf.Patch, memo: Any, logger: kopf.Logger, **_: Any
) -> None:
    ctx = ctx_of(memo)
    ns = namespace or (body.get("metadata") or {}).get("namespace") or "default"
    plan = restore_plan(ctx, body, ns)
    if plan is None:
        return
    if plan.action == "wait":
        hold(ctx, body, patch)
        ctx.metrics.pods_cold.labels("HeldForCheckpoint").inc()
        logger.info("pod held until its checkpoint is Ready (WaitForCheckpoint)")
        return
    snapshot, container = plan.snapshot, plan.container
    try:
        shaped = shape(body, snapshot=snapshot, container=container)
    except NotShapeable as exc:
        logger.warning("pod not shaped for restore (cold start): %s", exc)
        ctx.metrics.pods_cold.labels("NotShapeable").inc()
        return
    meta = shaped["metadata"]
    patch.metadata["annotations"] = meta["annotations"]
    patch.metadata["labels"] = meta["labels"]
    for key in ("containers", "volumes", "shareProcessNamespace"):
        patch.spec[key] = shaped["spec"][key]
    ctx.metrics.pods_shaped.inc()
    logger.info("pod %s shaped to restore from %s", meta.get("generateName") or meta.get("name"), snapshot)
