"""The pod-create webhook: pods of a SnapshotPolicy whose checkpoint is Ready (for the pod's own template)
are shaped for restore; every other pod passes untouched. The webhook configuration's failurePolicy is
Ignore, so an outage means a cold start, never a blocked rollout."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from podsnap import contract as c
from podsnap.kube.client import Kube, get_or_none
from podsnap.kube.tokens import RESTORE, Claims
from podsnap.operator import safe_env
from podsnap.operator.config import WEBHOOK_PATH_ID
from podsnap.operator.placement import mark, placement_of, with_required
from podsnap.operator.policy import serving_replicas, template_hash
from podsnap.operator.restore_pod import NotShapeable, Timeouts, failure_policy, shape
from podsnap.operator.runtime import OperatorContext, ctx_of, registry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Owner:
    kind: str
    name: str
    template: Mapping[str, Any]


def controller_of(meta: Mapping[str, Any]) -> Mapping[str, Any] | None:
    return next((r for r in meta.get("ownerReferences") or [] if r.get("controller")), None)


def _read_owned(kube: Kube, kind: str, ref: Mapping[str, Any], namespace: str) -> dict[str, Any] | None:
    """The object `ref` points at, in the pod's own namespace (the admission request's): an ownerReference
    names no namespace, and one that a pod's author wrote must never reach another namespace's workload."""
    if kind == "ReplicaSet":
        obj = get_or_none(kube.apps.read_namespaced_replica_set, ref["name"], namespace)
    else:
        obj = get_or_none(kube.apps.read_namespaced_stateful_set, ref["name"], namespace)
    if obj is None or (ref.get("uid") and obj.metadata.uid != ref["uid"]):
        return None
    return kube.sanitize(obj)


def find_owner(kube: Kube, pod: Mapping[str, Any], namespace: str | None) -> tuple[Owner, str] | None:
    """The Deployment or StatefulSet behind a new pod, with the template the pod was made from, and its namespace
    (the pod's own: without one, None)."""
    ref = controller_of(pod.get("metadata") or {})
    if not namespace or ref is None or ref.get("kind") not in ("ReplicaSet", "StatefulSet"):
        return None
    owned = _read_owned(kube, ref["kind"], ref, namespace)
    if owned is None:
        return None
    ns = owned["metadata"]["namespace"]
    if ref["kind"] == "StatefulSet":
        return Owner("StatefulSet", ref["name"], owned["spec"]["template"]), ns
    dep = controller_of(owned["metadata"])
    if dep is None or dep.get("kind") != "Deployment":
        return None
    # the ReplicaSet's template is the Deployment template this pod was made from (plus pod-template-hash,
    # which template_hash ignores), so a pod of an older rollout never restores a newer template's checkpoint
    return Owner("Deployment", dep["name"], owned["spec"]["template"]), ns


@dataclass(frozen=True)
class Plan:
    """`restore` from `snapshot` into `container`, or `wait` (WaitForCheckpoint, checkpoint not Ready)."""

    action: str
    snapshot: str = ""
    container: str = ""
    #: the namespace of the workload (and so of the pod and its token)
    namespace: str = ""
    #: the policy's skipCompatCheck, carried in the restore token (the pod's own annotation counts for nothing)
    skip_compat: bool = False
    #: the policy's spec.checkpointEnv (safe_env.py)
    checkpoint_env: safe_env.Override = field(default_factory=safe_env.Override)
    #: the policy's restoreFailurePolicy (a pod's own podsnap.io/restore-failure-policy overrides it)
    on_failure: str = c.RESTORE_FAILURE_COLD_START


def restore_plan(ctx: OperatorContext, pod: Mapping[str, Any], namespace: str | None) -> Plan | None:
    """What to do with a new pod; None leaves it untouched (a cold start)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if c.ANNOTATION_RESTORE_FROM in annotations:
        return None  # shaped already, or a hand-made restore pod: leave it as its author wrote it
    found = find_owner(ctx.kube, pod, namespace)
    if found is None:
        return None
    owner, namespace = found
    policies = ctx.kube.custom.list_namespaced_custom_object(c.GROUP, c.VERSION, namespace, c.PLURAL_SNAPSHOT_POLICIES)
    for policy in policies.get("items", []):
        ref = (policy.get("spec") or {}).get("targetRef") or {}
        if ref.get("kind") != owner.kind or ref.get("name") != owner.name:
            continue
        status, spec = policy.get("status") or {}, policy.get("spec") or {}
        pod_hash = template_hash(owner.template)
        current = status.get("templateHash") == pod_hash
        log.debug(
            "pod of %s %s: policy %s ready=%s hash %s, pod template hash %s",
            owner.kind, owner.name, policy["metadata"]["name"], status.get("ready"), status.get("templateHash"), pod_hash,
        )  # fmt: skip
        if status.get("ready") and status.get("checkpointName") and current:
            container = spec.get("targetContainerName") or "main"
            skip = spec.get("skipCompatCheck") is True
            where = f"SnapshotPolicy {namespace}/{policy['metadata']['name']}"
            on_failure = spec.get("restoreFailurePolicy")
            if on_failure not in c.RESTORE_FAILURE_POLICIES:
                on_failure = c.RESTORE_FAILURE_COLD_START
            return Plan(
                "restore",
                status["checkpointName"],
                container,
                namespace,
                skip,
                checkpoint_env=safe_env.override_of(spec, where),
                on_failure=on_failure,
            )
        if spec.get("startupPolicy") == c.STARTUP_POLICY_WAIT and _wait(ctx, owner, namespace, status, current):
            return Plan("wait")
        ctx.metrics.pods_cold.labels("TemplateChanged" if status.get("ready") else "CheckpointNotReady").inc()
        return None
    return None


def _wait(ctx: OperatorContext, owner: Owner, namespace: str, status: Mapping[str, Any], current: bool) -> bool:
    """WaitForCheckpoint holds a new pod only while its policy holds (status.holding, for the template it has
    seen), or, for a template the policy has not seen yet, while nothing of the workload serves: a serving
    workload's new template starts cold rather than take replicas away."""
    if current:
        return bool(status.get("holding"))
    read = (
        ctx.kube.apps.read_namespaced_deployment
        if owner.kind == "Deployment"
        else ctx.kube.apps.read_namespaced_stateful_set
    )
    target = get_or_none(read, owner.name, namespace)
    return target is None or serving_replicas(owner.kind, ctx.kube.sanitize(target)) == 0


def hold(ctx: OperatorContext, pod: Mapping[str, Any], patch: kopf.Patch) -> None:
    """WaitForCheckpoint: this pod must not start before the checkpoint is Ready. With scheduling gates the
    gate holds it; without (Kubernetes < 1.27) a node selector no node matches does. The operator's replica
    hold scales it away, or, once the hold ends (checkpoint Ready or its capture failed), the operator
    deletes it and its controller makes a new one: restored, or cold."""
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
    if safe_env.capture_pod(ctx, body, namespace, patch, logger):
        return  # a capture pod podsnap made (a Job's): never one to restore
    # `namespace` is the admission request's (webhook_server.with_request_namespace), never the pod's own say
    plan = restore_plan(ctx, body, namespace)
    if plan is None:
        return
    if plan.action == "wait":
        hold(ctx, body, patch)
        ctx.metrics.pods_cold.labels("HeldForCheckpoint").inc()
        logger.info("pod held until its checkpoint is Ready (WaitForCheckpoint)")
        return
    snapshot, container = plan.snapshot, plan.container
    on_failure = failure_policy(body, plan.on_failure)
    # skipCompatCheck skips the gates, so it skips placing by them too
    where = (
        None
        if plan.skip_compat or not ctx.config.placement
        else placement_of(ctx.kube, plan.namespace, snapshot, body.get("spec") or {})
    )
    if where is not None and where.unmatched and on_failure == c.RESTORE_FAILURE_COLD_START:
        cold: dict[str, Any] = {}
        mark(cold, where.unmatched)
        patch.metadata["labels"], patch.metadata["annotations"] = cold["labels"], cold["annotations"]
        logger.warning("pod not shaped for restore (cold start): %s", where.unmatched)
        ctx.metrics.pods_cold.labels(c.REASON_NO_COMPATIBLE_NODE).inc()
        return
    timeouts = Timeouts(ctx.config.restore_pickup_timeout_s, ctx.config.restore_max_s)
    try:
        shaped = shape(body, snapshot=snapshot, container=container, on_failure=on_failure, timeouts=timeouts)
    except NotShapeable as exc:
        logger.warning("pod not shaped for restore (cold start): %s", exc)
        ctx.metrics.pods_cold.labels("NotShapeable").inc()
        return
    safe_env.apply(shaped, container, safe_env.wanted(ctx.config.checkpoint_env, shaped, plan.checkpoint_env))
    meta = shaped["metadata"]
    claims = Claims(RESTORE, plan.namespace, container, snapshot, plan.skip_compat)
    meta["annotations"][c.ANNOTATION_RESTORE_TOKEN] = ctx.tokens.mint(claims)
    if plan.skip_compat or c.ANNOTATION_SKIP_COMPAT_CHECK in meta["annotations"]:
        meta["annotations"][c.ANNOTATION_SKIP_COMPAT_CHECK] = str(plan.skip_compat).lower()
    if where is not None:
        patch.spec["affinity"] = with_required(shaped["spec"].get("affinity"), where.expressions())
        if where.unmatched:  # restoreFailurePolicy Fail: Pending until such a node is Ready
            mark(meta, where.unmatched)
            logger.warning("restore pod held Pending (restoreFailurePolicy Fail): %s", where.unmatched)
    patch.metadata["annotations"] = meta["annotations"]
    patch.metadata["labels"] = meta["labels"]
    for key in ("containers", "volumes", "shareProcessNamespace"):
        patch.spec[key] = shaped["spec"][key]
    ctx.metrics.pods_shaped.inc()
    logger.info("pod %s shaped to restore from %s", meta.get("generateName") or meta.get("name"), snapshot)
