"""SnapshotPolicy: a SnapshotJob per pod-template hash of the target (a failed capture, or a checkpoint whose
artifact was lost, is tried again with a growing delay, visible on the policy); status.ready/checkpointName;
WaitForCheckpoint holds new pods while nothing serves yet and releases them (and the pods the webhook
held) as soon as the checkpoint is Ready or its capture failed; deletion honours deletionPolicy."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from podsnap import contract as c
from podsnap.kube import conditions
from podsnap.kube.client import Kube, get_or_none, require_ns
from podsnap.kube.conditions import Condition
from podsnap.kube.events import event
from podsnap.operator import prefetch
from podsnap.operator.capture_job import is_terminal as job_terminal
from podsnap.operator.policy import (
    Attempt,
    InvalidPolicy,
    PolicySpec,
    attempt_job_name,
    attempt_of,
    backoff_s,
    capture_template,
    held_pod,
    hold_patch,
    parse_spec,
    release_patch,
    selector_of,
    should_hold,
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


def _snapshot_job_body(
    name: str, namespace: str, policy: PolicySpec, template: Mapping[str, Any], *, h: str, job: str
) -> dict[str, Any]:
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.KIND_SNAPSHOT_JOB,
        "metadata": {
            "name": job,
            "namespace": namespace,
            "labels": {c.LABEL_POLICY: name, c.LABEL_TEMPLATE_HASH: h},
        },
        "spec": {
            "podTemplate": capture_template(template),
            "podSnapshotTemplate": {"targetContainers": [policy.container]},
        },
    }


@dataclass
class Outcome:
    """Where the policy's checkpoint stands: its name, whether it is Ready, why it failed (one line)."""

    checkpoint: str
    job: str = ""
    ready: bool = False
    failure: str = ""


def _failure(obj: Mapping[str, Any] | None, what: str) -> str:
    failed = conditions.find(((obj or {}).get("status") or {}).get("conditions"), c.COND_FAILED) or {}
    if failed.get("status") != conditions.TRUE:
        return ""
    return f"{what} failed ({failed.get('reason')}: {conditions.short(str(failed.get('message') or ''), 160)})"


def _outcome(kube: Kube, namespace: str, checkpoint: str, job: Mapping[str, Any] | None) -> Outcome:
    snapshot = kube.get_cr(c.PLURAL_POD_SNAPSHOTS, checkpoint, namespace)
    sconds = ((snapshot or {}).get("status") or {}).get("conditions")
    out = Outcome(checkpoint, (job or {}).get("metadata", {}).get("name", ""))
    out.ready = snapshot is not None and conditions.is_true(sconds, c.COND_READY)
    jstatus = (job or {}).get("status") or {}
    if job is not None and job_terminal(jstatus):
        out.failure = _failure(job, f"SnapshotJob {out.job}")
    out.failure = _failure(snapshot, f"PodSnapshot {checkpoint}") or out.failure
    return out


def _start_attempt(
    ctx: OperatorContext,
    *,
    body: Mapping[str, Any],
    policy: PolicySpec,
    template: Mapping[str, Any],
    h: str,
    attempt: Attempt,
) -> dict[str, Any]:
    """The attempt's SnapshotJob, created when missing; a retry first removes the attempt before it."""
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    job, created = ctx.kube.create_cr(
        c.PLURAL_SNAPSHOT_JOBS,
        _snapshot_job_body(name, namespace, policy, template, h=h, job=attempt.job_name),
        namespace,
    )
    if created and attempt.number > 1:
        previous = attempt_job_name(name, h, attempt.number - 1)
        for plural in (c.PLURAL_SNAPSHOT_JOBS, c.PLURAL_POD_SNAPSHOTS):
            ctx.kube.delete_cr(plural, previous, namespace)
        event(
            body, type_="Normal", reason="CaptureRetry", message=f"capture attempt {attempt.number}: {attempt.job_name}"
        )
    return job


def _condition(policy: PolicySpec, out: Outcome, attempt: Attempt, h: str) -> Condition:
    """Ready, or why not and what happens next, in a sentence or two."""
    if out.ready:
        return Condition(c.COND_READY, True, c.REASON_CHECKPOINT_READY, f"new pods restore from {out.checkpoint}")
    failed = c.REASON_CHECKPOINT_FAILED
    if policy.checkpoint_ref and out.failure:
        fix = "point spec.checkpointRef at a Ready PodSnapshot"
        return Condition(c.COND_READY, False, failed, f"{out.failure}; new pods start cold; {fix}")
    if attempt.next_at is not None:
        when = attempt.next_at.strftime("%Y-%m-%dT%H:%M:%SZ")
        message = (
            f"capture attempt {attempt.number - 1}: {attempt.last_failure}; new pods start cold; "
            f"attempt {attempt.number} starts at {when}"
        )
        return Condition(c.COND_READY, False, failed, message)
    message = f"capture attempt {attempt.number} of template {h}: {out.checkpoint}"
    return Condition(c.COND_READY, False, c.REASON_CHECKPOINT_PENDING, message)


def _set_condition(body: Mapping[str, Any], patch: kopf.Patch, cond: Condition, fields: Mapping[str, Any]) -> None:
    """Status fields, and the Ready condition with an Event when its reason or status changes."""
    status = body.get("status") or {}
    for key, value in fields.items():
        if status.get(key) != value:
            patch.status[key] = value
    old = conditions.find(status.get("conditions"), cond.type) or {}
    same = old.get("reason") == cond.reason and old.get("status") == (
        conditions.TRUE if cond.status else conditions.FALSE
    )
    if same and old.get("message") == conditions.short(cond.message):
        return
    patch.fns.append(conditions.patch_fn(cond))
    if not same:
        normal = cond.status or cond.reason == c.REASON_CHECKPOINT_PENDING
        event(body, type_="Normal" if normal else "Warning", reason=cond.reason, message=cond.message)


def reconcile(ctx: OperatorContext, body: Mapping[str, Any], patch: kopf.Patch, logger: kopf.Logger) -> None:
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    status = body.get("status") or {}
    try:
        policy = parse_spec(body.get("spec"))
    except InvalidPolicy as exc:
        _set_condition(body, patch, Condition(c.COND_READY, False, c.REASON_INVALID_SPEC, str(exc)), {"ready": False})
        return
    target = read_target(ctx.kube, policy.kind, policy.target, namespace)
    if target is None:
        msg = f"{policy.kind} {namespace}/{policy.target} not found; create it (the policy waits)"
        _set_condition(body, patch, Condition(c.COND_READY, False, c.REASON_TARGET_NOT_FOUND, msg), {"ready": False})
        return
    template = target["spec"]["template"]
    h = template_hash(template)
    now = datetime.datetime.now(datetime.UTC)
    attempt = attempt_of(status, name, h) if not policy.checkpoint_ref else Attempt(1, "")
    if policy.checkpoint_ref:
        out = _outcome(ctx.kube, namespace, policy.checkpoint_ref, None)
    elif attempt.waiting(now):
        # the failed attempt's objects stay named until the next attempt exists
        out = Outcome(str(status.get("checkpointName") or ""), str(status.get("snapshotJobName") or ""))
    else:
        job = _start_attempt(ctx, body=body, policy=policy, template=template, h=h, attempt=attempt)
        checkpoint = (job.get("status") or {}).get("podSnapshotName") or job["metadata"]["name"]
        out = _outcome(ctx.kube, namespace, checkpoint, job)
        attempt = Attempt(attempt.number, attempt.job_name, None, attempt.last_failure)  # running, not waiting
    fields: dict[str, Any] = {
        "checkpointName": out.checkpoint,
        "templateHash": h,
        "ready": out.ready,
        "snapshotJobName": out.job or None,
        "captureAttempt": attempt.number,
        "nextCaptureAt": attempt.next_at.strftime("%Y-%m-%dT%H:%M:%SZ") if attempt.next_at else None,
        "lastFailure": attempt.last_failure or None,
    }
    if out.failure and not policy.checkpoint_ref:
        # schedule the next attempt: the workload serves cold meanwhile
        retry_at = now + datetime.timedelta(seconds=backoff_s(attempt.number, ctx.config.capture_retry_base_s))
        fields.update(
            captureAttempt=attempt.number + 1,
            nextCaptureAt=retry_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
            lastFailure=out.failure,
        )
        attempt = Attempt(attempt.number + 1, attempt_job_name(name, h, attempt.number + 1), retry_at, out.failure)
        out.failure = ""
    hold = should_hold(policy, ready=out.ready, failed=bool(out.failure), attempt=attempt.number, target=target)
    fields["holding"] = hold
    _set_condition(body, patch, _condition(policy, out, attempt, h), fields)
    # every node's agent copies a Ready checkpoint into its node cache before the first restore pod arrives
    prefetch.sync(ctx, namespace, name, before=status.get("checkpointName"), now=out.checkpoint, ready=out.ready)
    _hold_or_release(ctx, body=body, policy=policy, target=target, hold=hold, fields=fields, logger=logger)


def _hold_or_release(
    ctx: OperatorContext,
    *,
    body: Mapping[str, Any],
    policy: PolicySpec,
    target: Mapping[str, Any],
    hold: bool,
    fields: Mapping[str, Any],
    logger: kopf.Logger,
) -> None:
    """WaitForCheckpoint: hold at zero while nothing serves yet; otherwise give the replicas back, and let
    the pods held for the checkpoint go (their controller re-creates them: restored, or cold)."""
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    change = hold_patch(target) if hold else release_patch(target)
    if change is not None and not hold:
        # the webhook reads the policy's status: it must be current before the first released pod is created
        def record(obj: dict[str, Any]) -> bool:
            obj["status"].update({k: v for k, v in fields.items() if v is not None})
            return True

        ctx.kube.update_cr_status(c.PLURAL_SNAPSHOT_POLICIES, name, namespace, record)
    if change is not None:
        patch_target(ctx.kube, policy.kind, policy.target, namespace, change)
        what = "held at 0 replicas until the checkpoint is Ready" if hold else "replicas given back"
        event(
            body,
            type_="Normal",
            reason="ReplicasHeld" if hold else "ReplicasReleased",
            message=f"{policy.kind} {policy.target}: {what}",
        )
        logger.info("%s %s: %s", policy.kind, policy.target, what)
    if not hold:
        swept = sweep_held_pods(ctx.kube, namespace, target)
        if swept:
            message = f"deleted {len(swept)} pod(s) held for the checkpoint ({', '.join(swept[:5])}); their controller re-creates them"
            event(body, type_="Normal", reason="HeldPodsReleased", message=message)


def sweep_held_pods(kube: Kube, namespace: str, target: Mapping[str, Any]) -> list[str]:
    """Delete the target's pods still held by the webhook's gate or node selector: only podsnap could let
    them run, and it no longer holds them."""
    selector = selector_of(target)
    if not selector:
        return []
    pods = kube.core.list_namespaced_pod(namespace, label_selector=selector, field_selector="status.phase=Pending")
    swept = []
    for pod in pods.items:
        obj = kube.sanitize(pod)
        name = obj["metadata"]["name"]
        if (
            held_pod(obj)
            and not obj["metadata"].get("deletionTimestamp")
            and get_or_none(kube.core.delete_namespaced_pod, name, namespace) is not None
        ):
            swept.append(name)
    return swept


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
    if checkpoint := (body.get("status") or {}).get("checkpointName"):
        prefetch.release(ctx, namespace, name, checkpoint)
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
