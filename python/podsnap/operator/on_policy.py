"""SnapshotPolicy: one SnapshotJob per pod-template hash of the target; status.ready/checkpointName;
WaitForCheckpoint holds the workload at zero replicas until the checkpoint is Ready (Kubernetes without
pod scheduling gates); deletion honours deletionPolicy."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf

from podsnap import contract as c
from podsnap.kube import conditions
from podsnap.kube.client import Kube, get_or_none, require_ns
from podsnap.kube.conditions import Condition
from podsnap.kube.events import event
from podsnap.operator.capture_job import is_terminal as job_terminal
from podsnap.operator.policy import (
    InvalidPolicy,
    PolicySpec,
    capture_template,
    hold_patch,
    parse_spec,
    release_patch,
    snapshot_job_name,
    template_hash,
)
from podsnap.operator.runtime import OperatorContext, ctx_of, registry

POLICIES = (c.GROUP, c.VERSION, c.PLURAL_SNAPSHOT_POLICIES)


def read_target(kube: Kube, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
    read = kube.apps.read_namespaced_deployment if kind == "Deployment" else kube.apps.read_namespaced_stateful_set
    obj = get_or_none(read, name, namespace)
    return None if obj is None else kube.sanitize(obj)


def patch_target(kube: Kube, kind: str, name: str, namespace: str, body: dict[str, Any]) -> None:
    fn = kube.apps.patch_namespaced_deployment if kind == "Deployment" else kube.apps.patch_namespaced_stateful_set
    fn(name, namespace, body)


def _snapshot_job_body(name: str, namespace: str, policy: PolicySpec, template: Mapping[str, Any], h: str) -> dict:
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.KIND_SNAPSHOT_JOB,
        "metadata": {
            "name": snapshot_job_name(name, h),
            "namespace": namespace,
            "labels": {c.LABEL_POLICY: name, c.LABEL_TEMPLATE_HASH: h},
        },
        "spec": {
            "podTemplate": capture_template(template),
            "podSnapshotTemplate": {"targetContainers": [policy.container]},
        },
    }


def reconcile(ctx: OperatorContext, body: Mapping[str, Any], patch: kopf.Patch, logger: kopf.Logger) -> None:
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    status = body.get("status") or {}
    conds = status.get("conditions")
    kube = ctx.kube

    def set_conditions(*updates: Condition) -> None:
        for u in updates:
            old = conditions.find(conds, u.type)
            if (
                old is None
                or old.get("reason") != u.reason
                or old.get("status") != (conditions.TRUE if u.status else conditions.FALSE)
            ):
                patch.fns.append(conditions.patch_fn(*updates))
                normal = u.status or u.reason == c.REASON_CHECKPOINT_PENDING
                event(body, type_="Normal" if normal else "Warning", reason=u.reason, message=u.message)
                return

    try:
        policy = parse_spec(body.get("spec"))
    except InvalidPolicy as exc:
        set_conditions(Condition(c.COND_READY, False, c.REASON_INVALID_SPEC, str(exc)))
        patch.status["ready"] = False
        return
    target = read_target(kube, policy.kind, policy.target, namespace)
    if target is None:
        msg = f"{policy.kind} {namespace}/{policy.target} not found; create it (the policy waits)"
        set_conditions(Condition(c.COND_READY, False, c.REASON_TARGET_NOT_FOUND, msg))
        patch.status["ready"] = False
        return
    template = target["spec"]["template"]
    h = template_hash(template)

    failed_msg = None
    if policy.checkpoint_ref:
        snapshot_name = policy.checkpoint_ref
    else:
        job, _ = kube.create_cr(
            c.PLURAL_SNAPSHOT_JOBS, _snapshot_job_body(name, namespace, policy, template, h), namespace
        )
        snapshot_name = (job.get("status") or {}).get("podSnapshotName") or job["metadata"]["name"]
        patch.status["snapshotJobName"] = job["metadata"]["name"]
        jstatus = job.get("status") or {}
        if job_terminal(jstatus) and conditions.is_true(jstatus.get("conditions"), c.COND_FAILED):
            failed = conditions.find(jstatus.get("conditions"), c.COND_FAILED) or {}
            failed_msg = (
                f"SnapshotJob {job['metadata']['name']} failed ({failed.get('reason')}: {failed.get('message')}); "
                "new pods start cold. Delete the SnapshotJob to retry."
            )
    snapshot = kube.get_cr(c.PLURAL_POD_SNAPSHOTS, snapshot_name, namespace)
    sconds = (snapshot or {}).get("status", {}).get("conditions")
    ready = snapshot is not None and conditions.is_true(sconds, c.COND_READY)
    if snapshot is not None and conditions.is_true(sconds, c.COND_FAILED):
        failed = conditions.find(sconds, c.COND_FAILED) or {}
        failed_msg = f"PodSnapshot {snapshot_name} failed ({failed.get('reason')}: {failed.get('message')})"

    patch.status["checkpointName"] = snapshot_name
    patch.status["templateHash"] = h
    patch.status["ready"] = ready
    if ready:
        set_conditions(
            Condition(c.COND_READY, True, c.REASON_CHECKPOINT_READY, f"new pods restore from {snapshot_name}")
        )
    elif failed_msg:
        set_conditions(Condition(c.COND_READY, False, c.REASON_CHECKPOINT_FAILED, failed_msg))
    else:
        set_conditions(
            Condition(c.COND_READY, False, c.REASON_CHECKPOINT_PENDING, f"capturing {snapshot_name} (template {h})")
        )

    # WaitForCheckpoint: no replica may start before the checkpoint is Ready. Pods made in the moment
    # before the hold are gated by the webhook; the hold scales them away, so every pod after Ready restores.
    # A failed capture releases the hold: serving cold beats not serving.
    hold = policy.startup == c.STARTUP_POLICY_WAIT and not ready and not failed_msg
    change = hold_patch(target) if hold else release_patch(target)
    if change is not None and not hold:
        # the webhook reads the policy's status: it must say Ready before the first released pod is created
        fields = {"ready": ready, "checkpointName": snapshot_name, "templateHash": h}

        def record(obj: dict[str, Any]) -> bool:
            obj["status"].update(fields)
            return True

        kube.update_cr_status(c.PLURAL_SNAPSHOT_POLICIES, name, namespace, record)
    if change is not None:
        patch_target(kube, policy.kind, policy.target, namespace, change)
        what = (
            "held at 0 replicas until the checkpoint is Ready"
            if hold
            else f"replicas released (ready={ready}, failed={failed_msg})"
        )
        event(
            body,
            type_="Normal",
            reason="ReplicasHeld" if hold else "ReplicasReleased",
            message=f"{policy.kind} {policy.target}: {what}",
        )
        logger.info("%s %s: %s", policy.kind, policy.target, what)


# one timer, no change handlers: a single reconcile per policy at a time (a change handler running beside
# the timer could write an older view of the checkpoint over a newer one)
@kopf.timer(*POLICIES, registry=registry, interval=2.0)
def policy_tick(*, body: kopf.Body, patch: kopf.Patch, memo: Any, logger: kopf.Logger, **_: Any) -> None:
    reconcile(ctx_of(memo), body, patch, logger)


@kopf.on.delete(*POLICIES, registry=registry)
def policy_delete(
    *,
    spec: kopf.Spec,
    name: str,
    namespace: str | None,
    body: kopf.Body,
    memo: Any,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    ctx = ctx_of(memo)
    namespace = require_ns(namespace)
    try:
        policy = parse_spec(spec)
    except InvalidPolicy:
        return
    target = read_target(ctx.kube, policy.kind, policy.target, namespace)
    if target is not None and (change := release_patch(target)) is not None:
        # without its policy the workload serves cold rather than stay at zero
        patch_target(ctx.kube, policy.kind, policy.target, namespace, change)
    if policy.deletion != c.DELETION_POLICY_DELETE or policy.checkpoint_ref:
        return
    selector = f"{c.LABEL_POLICY}={name}"
    for plural in (c.PLURAL_SNAPSHOT_JOBS, c.PLURAL_POD_SNAPSHOTS):
        items = ctx.kube.custom.list_namespaced_custom_object(
            c.GROUP, c.VERSION, namespace, plural, label_selector=selector
        )["items"]
        for item in items:
            ctx.kube.delete_cr(plural, item["metadata"]["name"], namespace)
            logger.info("deletionPolicy Delete: deleted %s/%s", plural, item["metadata"]["name"])
