"""PodSnapshot -> PodSnapshotContent bound to the source pod's node; content status mirrored back;
deletion cascades to the content (whose own finalizer removes the artifact; operator/orphans.py hands it
to another agent when its node's agent cannot)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, NoReturn

import kopf

from podsnap import contract as c
from podsnap.kube import conditions
from podsnap.kube.client import get_or_none, require_ns
from podsnap.kube.conditions import Condition
from podsnap.kube.events import event
from podsnap.kube.reporter import kopf_patch, report
from podsnap.kube.tokens import InvalidToken, capture_claims, not_a_capture_source
from podsnap.operator import orphans
from podsnap.operator.runtime import OperatorContext, ctx_of, registry

SNAPSHOTS = (c.GROUP, c.VERSION, c.PLURAL_POD_SNAPSHOTS)
CONTENTS = (c.GROUP, c.VERSION, c.PLURAL_POD_SNAPSHOT_CONTENTS)
SOURCE_FIELDS = ("node", "kernel", "arch", "glibc", "driver", "gpus", "cudaGpus", "imageID", "memoryLimitBytes")


def snapshot_terminal(status: Mapping[str, Any] | None) -> bool:
    conds = (status or {}).get("conditions")
    return conditions.is_true(conds, c.COND_READY) or conditions.is_true(conds, c.COND_FAILED)


def _not_terminal(status: Mapping[str, Any], **_: Any) -> bool:
    return not snapshot_terminal(status)


def artifact_path(namespace: str, name: str, uid: str) -> str:
    """Relative to the artifact root; the uid keeps a re-created snapshot of the same name apart."""
    return f"{namespace}/{name}-{uid}"


def content_body(*, name: str, namespace: str, uid: str, pod: Mapping[str, Any], container: str) -> dict[str, Any]:
    node = pod["spec"]["nodeName"]
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.KIND_POD_SNAPSHOT_CONTENT,
        "metadata": {
            "name": c.content_name(uid),
            "labels": {c.LABEL_SNAPSHOT_NODE: node},
            # present from the first write, so no agent can see the content without it
            "finalizers": [c.FINALIZER_CONTENT_ARTIFACT],
        },
        "spec": {
            "podSnapshotRef": {"namespace": namespace, "name": name, "uid": uid},
            "source": {
                "podRef": {
                    "namespace": namespace,
                    "name": pod["metadata"]["name"],
                    "uid": pod["metadata"]["uid"],
                    "containers": [container],
                }
            },
            "nodeName": node,
            "artifactPath": artifact_path(namespace, name, uid),
            "deletionPolicy": c.DELETION_POLICY_DELETE,
        },
    }


def _fail(ctx: OperatorContext, body: Mapping[str, Any], patch: kopf.Patch, reason: str, message: str) -> NoReturn:
    report(
        body,
        Condition(c.COND_FAILED, True, reason, message),
        Condition(c.COND_READY, False, reason, message),
        write=kopf_patch(patch),
        warning=True,
        count=ctx.metrics.capture_failures.labels(c.KIND_POD_SNAPSHOT, reason),
    )
    raise kopf.PermanentError(message)


@kopf.on.create(*SNAPSHOTS, registry=registry)
@kopf.on.resume(*SNAPSHOTS, registry=registry, when=_not_terminal)
def podsnapshot_bind(
    *,
    spec: kopf.Spec,
    status: kopf.Status,
    name: str,
    namespace: str | None,
    uid: str,
    body: kopf.Body,
    patch: kopf.Patch,
    memo: Any,
    **_: Any,
) -> None:
    ctx = ctx_of(memo)
    namespace = require_ns(namespace)
    if snapshot_terminal(status):
        return
    ref = (spec.get("source") or {}).get("podRef") or {}
    containers = ref.get("containers") or ["main"]
    if not ref.get("name") or len(containers) != 1:
        _fail(ctx, body, patch, c.REASON_INVALID_SPEC, "spec.source.podRef needs a name and exactly one container")
    pod_obj = get_or_none(ctx.kube.core.read_namespaced_pod, ref["name"], namespace)
    if pod_obj is None:
        _fail(ctx, body, patch, c.REASON_POD_NOT_FOUND, f"source pod {namespace}/{ref['name']} does not exist")
    pod = ctx.kube.sanitize(pod_obj)
    if ref.get("uid") and pod["metadata"]["uid"] != ref["uid"]:
        _fail(
            ctx,
            body,
            patch,
            c.REASON_POD_UID_MISMATCH,
            f"pod {ref['name']} has uid {pod['metadata']['uid']}, not {ref['uid']}: it was re-created; "
            "snapshot the new pod with a new PodSnapshot",
        )
    names = [ct["name"] for ct in pod["spec"]["containers"]]
    if containers[0] not in names:
        _fail(ctx, body, patch, c.REASON_CONTAINER_NOT_FOUND, f"container {containers[0]!r} not in pod ({names})")
    try:
        capture_claims(ctx.tokens, pod, containers[0], job=name)
    except InvalidToken as exc:
        _fail(ctx, body, patch, c.REASON_NOT_A_CAPTURE_SOURCE, not_a_capture_source(namespace, ref["name"], exc))
    if not pod["spec"].get("nodeName"):
        raise kopf.TemporaryError(f"source pod {ref['name']} is not scheduled yet", delay=2)
    content, created = ctx.kube.create_cr(
        c.PLURAL_POD_SNAPSHOT_CONTENTS,
        content_body(name=name, namespace=namespace, uid=uid, pod=pod, container=containers[0]),
    )
    content_name = content["metadata"]["name"]
    patch.status["boundSnapshotContentName"] = content_name
    if conditions.find(status.get("conditions"), c.COND_READY) is None:
        msg = f"bound to {content_name} on node {pod['spec']['nodeName']}; waiting for its agent"
        patch.fns.append(conditions.patch_fn(Condition(c.COND_READY, False, c.REASON_PENDING, msg)))
    if created:
        event(body, type_="Normal", reason="Bound", message=f"created {content_name} on {pod['spec']['nodeName']}")


def mirror(snapshot: dict[str, Any], content: Mapping[str, Any]) -> bool:
    """Copy the content's outcome onto the snapshot (in place). Failed is sticky. Returns whether it changed."""
    status = snapshot.setdefault("status", {})
    if conditions.is_true(status.get("conditions"), c.COND_FAILED):
        return False
    before = copy.deepcopy(status)
    cstatus = content.get("status") or {}
    cconds = cstatus.get("conditions")
    ready = conditions.find(cconds, c.COND_READY)
    failed = conditions.find(cconds, c.COND_FAILED)
    status["boundSnapshotContentName"] = content["metadata"]["name"]
    if failed is not None and failed.get("status") == conditions.TRUE:
        reason, msg = failed.get("reason") or c.REASON_CAPTURE_FAILED, failed.get("message", "")
        updates = [Condition(c.COND_FAILED, True, reason, msg), Condition(c.COND_READY, False, reason, msg)]
    elif ready is not None and ready.get("status") == conditions.TRUE:
        updates = [Condition(c.COND_READY, True, ready.get("reason") or c.REASON_CAPTURE_COMPLETED, "captured")]
        for key in ("artifact", "capturedAt", "captureTimingsMs"):
            if key in cstatus:
                status[key] = cstatus[key]
        source = cstatus.get("source") or {}
        status["source"] = {k: source[k] for k in SOURCE_FIELDS if k in source}
    else:
        detail = f" ({ready.get('reason')}: {ready.get('message', '')})" if ready else ""
        updates = [Condition(c.COND_READY, False, c.REASON_PENDING, f"waiting for the node agent{detail}")]
    status["conditions"] = conditions.merged(status.get("conditions"), updates)
    return bool(status != before)


@kopf.timer(*SNAPSHOTS, registry=registry, interval=3.0, initial_delay=3.0, when=_not_terminal)
def podsnapshot_resync(*, status: kopf.Status, uid: str, memo: Any, logger: kopf.Logger, **_: Any) -> None:
    """Event handlers are not retried: if a content event was lost (an API error while mirroring), this
    level-triggered pass mirrors the content's current status onto a snapshot that is still pending. The
    content is the one named after the snapshot's uid, whatever its (user-writable) status names."""
    if not status.get("boundSnapshotContentName"):
        return
    name = c.content_name(uid)
    ctx = ctx_of(memo)
    content = ctx.kube.get_cr(c.PLURAL_POD_SNAPSHOT_CONTENTS, name)
    if content is not None and not (content.get("metadata") or {}).get("deletionTimestamp"):
        mirror_content(ctx, content)


@kopf.on.event(*CONTENTS, registry=registry)
def content_changed(*, body: kopf.Body, type: str | None, memo: Any, logger: kopf.Logger, **_: Any) -> None:
    ctx = ctx_of(memo)
    if type == "DELETED":
        return
    meta = body.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        orphans.collect(ctx, body, logger)  # its node or its node's agent may be gone
        return
    mirror_content(ctx, body)


def mirror_content(ctx: OperatorContext, body: Mapping[str, Any]) -> None:
    """Copy a content's status onto its PodSnapshot; Events and metrics on the transitions."""
    ref = (body.get("spec") or {}).get("podSnapshotRef") or {}
    if not ref.get("name") or not ref.get("namespace"):
        return
    before: list[tuple[bool, bool]] = []

    def apply(snapshot: dict[str, Any]) -> bool:
        if ref.get("uid") and snapshot["metadata"]["uid"] != ref["uid"]:
            return False  # the content of an older snapshot of the same name
        conds = (snapshot.get("status") or {}).get("conditions")
        before.append((conditions.is_true(conds, c.COND_READY), conditions.is_true(conds, c.COND_FAILED)))
        return mirror(snapshot, body)

    updated = ctx.kube.update_cr_status(c.PLURAL_POD_SNAPSHOTS, ref["name"], ref["namespace"], apply)
    if updated is None or not before:
        return
    was_ready, was_failed = before[-1]
    conds = (updated.get("status") or {}).get("conditions")
    if conditions.is_true(conds, c.COND_READY) and not was_ready:
        size = ((updated.get("status") or {}).get("artifact") or {}).get("sizeBytes") or 0
        ctx.metrics.capture_bytes.inc(size)
        event(updated, type_="Normal", reason=c.REASON_CAPTURE_COMPLETED, message=f"artifact ready ({size} bytes)")
    elif conditions.is_true(conds, c.COND_FAILED) and not was_failed:
        failed = conditions.find(conds, c.COND_FAILED) or {}
        ctx.metrics.capture_failures.labels(c.KIND_POD_SNAPSHOT, str(failed.get("reason"))).inc()
        event(updated, type_="Warning", reason=str(failed.get("reason")), message=str(failed.get("message")))


def own_content(content: Mapping[str, Any] | None, *, namespace: str, name: str, uid: str) -> bool:
    """Whether `content` is the one this snapshot made: bound back to it by namespace, name and uid."""
    ref = ((content or {}).get("spec") or {}).get("podSnapshotRef") or {}
    return (ref.get("namespace"), ref.get("name"), ref.get("uid")) == (namespace, name, uid)


@kopf.on.delete(*SNAPSHOTS, registry=registry)
def podsnapshot_delete(
    *, name: str, namespace: str | None, uid: str, body: kopf.Body, memo: Any, logger: kopf.Logger, **_: Any
) -> None:
    """Deleting a PodSnapshot deletes its own content, and no other: the one named after its uid whose
    podSnapshotRef names it back. status.boundSnapshotContentName is never read here: a user who may write
    the status could point it at another namespace's content."""
    ctx = ctx_of(memo)
    content_name = c.content_name(uid)
    content = ctx.kube.get_cr(c.PLURAL_POD_SNAPSHOT_CONTENTS, content_name)
    if content is None:
        return
    if not own_content(content, namespace=require_ns(namespace), name=name, uid=uid):
        logger.warning(f"{content_name} is bound to another snapshot; left as it is")
        return
    if not content["metadata"].get("deletionTimestamp"):
        ctx.kube.delete_cr(c.PLURAL_POD_SNAPSHOT_CONTENTS, content_name)
        event(body, type_="Normal", reason="ContentDeleting", message=f"deleting {content_name} and its artifact")
    raise kopf.TemporaryError(f"waiting for {content_name} to release its artifact", delay=1)
