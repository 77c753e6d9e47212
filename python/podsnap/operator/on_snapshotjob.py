"""SnapshotJob: create the capture Job, then advance the state machine in `capture_job.decide` every tick."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from podsnap import contract as c
from podsnap.kube import conditions
from podsnap.kube.client import Kube, get_or_none, require_ns
from podsnap.kube.conditions import Condition, now_rfc3339, parse_time
from podsnap.kube.events import event
from podsnap.kube.reporter import kopf_patch, report
from podsnap.kube.tokens import CAPTURE, Claims
from podsnap.operator import capture_seccomp, safe_env
from podsnap.operator.capture_job import InvalidSpec, build_job, decide, is_terminal, parse_spec
from podsnap.operator.runtime import OperatorContext, ctx_of, registry

RESOURCE = (c.GROUP, c.VERSION, c.PLURAL_SNAPSHOT_JOBS)
#: labels a SnapshotJob passes on to its PodSnapshot (the policy that made it, the template it captured)
INHERITED_LABELS = (c.LABEL_POLICY, c.LABEL_TEMPLATE_HASH)


def _not_terminal(status: Mapping[str, Any], **_: Any) -> bool:
    return not is_terminal(status)


@kopf.on.create(*RESOURCE, registry=registry)
@kopf.on.resume(*RESOURCE, registry=registry, when=_not_terminal)
def snapshotjob_start(
    *,
    spec: kopf.Spec,
    status: kopf.Status,
    name: str,
    namespace: str | None,
    uid: str,
    labels: Mapping[str, str],
    body: kopf.Body,
    patch: kopf.Patch,
    memo: Any,
    **_: Any,
) -> None:
    ctx = ctx_of(memo)
    namespace = require_ns(namespace)
    if is_terminal(status):
        return
    try:
        capture = parse_spec(spec)
    except InvalidSpec as exc:
        report(
            body,
            Condition(c.COND_FAILED, True, c.REASON_INVALID_SPEC, str(exc)),
            Condition(c.COND_RUNNING, False, c.REASON_INVALID_SPEC, str(exc)),
            write=kopf_patch(patch, completedAt=now_rfc3339()),
            warning=True,
            count=ctx.metrics.capture_failures.labels(c.KIND_SNAPSHOT_JOB, c.REASON_INVALID_SPEC),
        )
        raise kopf.PermanentError(str(exc)) from None
    extra = {k: v for k, v in labels.items() if k in INHERITED_LABELS}
    job = build_job(
        name=name,
        namespace=namespace,
        uid=uid,
        spec=capture,
        seccomp_profile=ctx.config.seccomp_profile,
        extra_labels=extra,
    )
    # the mark that lets the agent capture this Job's pod, and no pod a namespace user made
    token = ctx.tokens.mint(Claims(CAPTURE, namespace, capture.target_container, name))
    job["spec"]["template"]["metadata"]["annotations"][c.ANNOTATION_CAPTURE_TOKEN] = token
    # the checkpoint-safe environment goes into the Job's pod template itself: the pod webhook, which
    # sets it on restore pods, fails open (a pod created while it is down is not shaped), and a source
    # captured without it could hold connections or mappings no restore can bring back
    template = job["spec"]["template"]
    override = safe_env.capture_override(ctx, namespace, name)
    safe_env.apply(template, capture.target_container, safe_env.wanted(ctx.config.checkpoint_env, template, override))
    try:
        ctx.kube.batch.create_namespaced_job(namespace, job)
        event(body, type_="Normal", reason="JobCreated", message=f"created capture Job {job['metadata']['name']}")
        profile = ctx.config.seccomp_profile
        if profile and (kept := capture_seccomp.kept(capture.pod_template, profile)):
            event(
                body,
                type_="Normal",
                reason=c.REASON_SECCOMP_PROFILE_KEPT,
                message=(
                    f"the pod template's own seccomp profile is kept for the {', '.join(kept)} instead of "
                    f"podsnap's {profile}: podsnap does not block io_uring there, and a capture of a worker "
                    "using io_uring fails (CRIU cannot checkpoint it)"
                ),
            )
    except ApiException as exc:
        if exc.status != 409:
            raise
    if not status.get("startedAt"):
        patch.status["startedAt"] = now_rfc3339()
    patch.status["jobName"] = job["metadata"]["name"]
    if conditions.find(status.get("conditions"), c.COND_RUNNING) is None:
        patch.fns.append(
            conditions.patch_fn(Condition(c.COND_RUNNING, True, c.REASON_POD_PENDING, "waiting for the source pod"))
        )


def _source_pod(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    pods = kube.core.list_namespaced_pod(namespace, label_selector=f"{c.LABEL_SNAPSHOT_JOB}={name}")
    live = [p for p in pods.items if p.metadata.deletion_timestamp is None] or pods.items
    if not live:
        return None
    newest = max(live, key=lambda p: p.metadata.creation_timestamp)
    return kube.sanitize(newest)


def _snapshot_body(name: str, namespace: str, pod: Mapping[str, Any], target: str, labels: Mapping[str, str]) -> dict:
    inherited = {k: v for k, v in labels.items() if k in INHERITED_LABELS}
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.KIND_POD_SNAPSHOT,
        "metadata": {"name": name, "namespace": namespace, "labels": {c.LABEL_SNAPSHOT_JOB: name, **inherited}},
        "spec": {
            "source": {
                "podRef": {"name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"], "containers": [target]}
            }
        },
    }


@kopf.timer(*RESOURCE, registry=registry, interval=1.0, when=_not_terminal)
def snapshotjob_reconcile(
    *,
    spec: kopf.Spec,
    status: kopf.Status,
    name: str,
    namespace: str | None,
    labels: Mapping[str, str],
    body: kopf.Body,
    patch: kopf.Patch,
    memo: Any,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    ctx = ctx_of(memo)
    namespace = require_ns(namespace)
    if not status.get("jobName"):
        return  # the create handler has not run yet (or failed validation)
    capture = parse_spec(spec)
    kube = ctx.kube
    job = get_or_none(kube.batch.read_namespaced_job, status["jobName"], namespace)
    job_body = kube.sanitize(job) if job is not None else None
    pod = _source_pod(kube, namespace, name)
    snapshot = kube.get_cr(c.PLURAL_POD_SNAPSHOTS, status.get("podSnapshotName") or name, namespace)
    if snapshot is not None and (snapshot["metadata"].get("labels") or {}).get(c.LABEL_SNAPSHOT_JOB) != name:
        snapshot = None  # a PodSnapshot of that name that this job did not make
    now = datetime.datetime.now(datetime.UTC)
    step = decide(
        status=status,
        deadline_s=capture.deadline_s,
        now=now,
        job=job_body,
        pod=pod,
        snapshot=snapshot,
        job_expected=True,
    )
    if step.create_snapshot_for is not None:
        created, fresh = kube.create_cr(
            c.PLURAL_POD_SNAPSHOTS,
            _snapshot_body(name, namespace, step.create_snapshot_for, capture.target_container, labels),
            namespace,
        )
        step.status.update(
            podSnapshotName=created["metadata"]["name"],
            podSnapshotUID=created["metadata"]["uid"],
            podName=step.create_snapshot_for["metadata"]["name"],
        )
        if fresh:
            event(body, type_="Normal", reason="PodSnapshotCreated", message=f"created PodSnapshot {name}")
    if step.delete_job and job_body is not None:
        try:
            kube.batch.delete_namespaced_job(status["jobName"], namespace, propagation_policy="Background")
        except ApiException as exc:
            if exc.status != 404:
                raise
    _apply(ctx, step.conditions, step.status, status, patch)
    if step.event is not None:
        event(body, type_=step.event[0], reason=step.event[1], message=step.event[2])
    if step.terminal and step.conditions:
        _observe(ctx, status, step)


def _apply(
    ctx: OperatorContext,
    updates: list[Condition],
    fields: Mapping[str, Any],
    status: Mapping[str, Any],
    patch: kopf.Patch,
) -> None:
    for key, value in fields.items():
        if status.get(key) != value:
            patch.status[key] = value
    changed = [
        u
        for u in updates
        if (old := conditions.find(status.get("conditions"), u.type)) is None
        or old.get("status") != (conditions.TRUE if u.status else conditions.FALSE)
        or old.get("reason") != u.reason
    ]
    if changed:
        patch.fns.append(conditions.patch_fn(*updates))


def _observe(ctx: OperatorContext, status: Mapping[str, Any], step: Any) -> None:
    failed = next((u for u in step.conditions if u.type == c.COND_FAILED and u.status), None)
    if failed is not None:
        ctx.metrics.capture_failures.labels(c.KIND_SNAPSHOT_JOB, failed.reason).inc()
        return
    started = parse_time(status.get("startedAt"))
    if started is not None:
        ctx.metrics.capture_seconds.observe((datetime.datetime.now(datetime.UTC) - started).total_seconds())
