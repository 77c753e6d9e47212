"""Prefetch marks: while a SnapshotPolicy is Ready, the PodSnapshotContent of its checkpoint carries the
label `podsnap.io/prefetch: "true"`, and every agent copies that artifact into its node-local cache
before the first restore pod arrives (agent/on_prefetch.py).

Several policies may restore from one checkpoint (spec.checkpointRef), so the content's annotation
`podsnap.io/prefetch-for` lists the policies (`namespace/name`) holding the label; the label goes with
the last of them (its policy deleted, or moved to a new checkpoint). Writes are merge patches guarded
by the resourceVersion read, so two policies never lose each other's entry.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from podsnap import contract as c
from podsnap.kube.client import Kube
from podsnap.operator.runtime import OperatorContext

log = logging.getLogger(__name__)
RETRIES = 5


def holders_of(content: Mapping[str, Any]) -> set[str]:
    raw = ((content.get("metadata") or {}).get("annotations") or {}).get(c.ANNOTATION_PREFETCH_FOR) or ""
    return {h for h in raw.split(",") if h}


def _patch(holders: set[str]) -> dict[str, Any]:
    if not holders:
        return {"labels": {c.LABEL_PREFETCH: None}, "annotations": {c.ANNOTATION_PREFETCH_FOR: None}}
    return {"labels": {c.LABEL_PREFETCH: "true"}, "annotations": {c.ANNOTATION_PREFETCH_FOR: ",".join(sorted(holders))}}


def _update(kube: Kube, content: str, holder: str, *, hold: bool) -> bool:
    """Add or remove `holder` on `content` (label with it); False when the content does not exist."""
    for _ in range(RETRIES):
        obj = kube.get_cr(c.PLURAL_POD_SNAPSHOT_CONTENTS, content)
        if obj is None:
            return False
        holders = holders_of(obj)
        want = holders | {holder} if hold else holders - {holder}
        labelled = (obj["metadata"].get("labels") or {}).get(c.LABEL_PREFETCH) == "true"
        if want == holders and labelled == bool(want):
            return True
        meta = {"resourceVersion": obj["metadata"]["resourceVersion"], **_patch(want)}
        try:
            kube.custom.patch_cluster_custom_object(
                c.GROUP, c.VERSION, c.PLURAL_POD_SNAPSHOT_CONTENTS, content, {"metadata": meta}
            )
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            if exc.status != 409:
                raise
    raise RuntimeError(f"{content}: its prefetch holders kept changing under {RETRIES} writes")


def _content_of(kube: Kube, namespace: str, snapshot: str) -> str | None:
    snap = kube.get_cr(c.PLURAL_POD_SNAPSHOTS, snapshot, namespace)
    return None if snap is None else c.content_name(snap["metadata"]["uid"])


def sync(ctx: OperatorContext, namespace: str, policy: str, *, before: str | None, now: str, ready: bool) -> None:
    """Called by each policy reconcile: label the content of checkpoint `now` while the policy is Ready,
    unlabel the content of the checkpoint it restored from `before`, if another. Never fails the
    reconcile: prefetch only makes restores faster."""
    try:
        _sync(ctx, namespace, policy, before=before, now=now, ready=ready)
    except (ApiException, RuntimeError) as exc:
        log.warning("prefetch: %s/%s: %s (the next reconcile tries again)", namespace, policy, exc)


def _sync(ctx: OperatorContext, namespace: str, policy: str, *, before: str | None, now: str, ready: bool) -> None:
    holder = f"{namespace}/{policy}"
    if before and before != now:
        release(ctx, namespace, policy, before)
    marked = ctx.prefetch_marked.get(holder)
    if ready and (marked is None or marked[0] != now):
        content = _content_of(ctx.kube, namespace, now)
        if content is not None and _update(ctx.kube, content, holder, hold=True):
            ctx.prefetch_marked[holder] = (now, content)
            log.info("prefetch: %s marks %s", holder, content)
    elif not ready and marked is not None and marked[0] == now:
        _update(ctx.kube, marked[1], holder, hold=False)
        ctx.prefetch_marked.pop(holder, None)


def release(ctx: OperatorContext, namespace: str, policy: str, snapshot: str) -> None:
    """The policy no longer restores from `snapshot` (deleted, or moved on): take its mark off. Never
    fails the caller (a policy's deletion must not wait on it)."""
    holder = f"{namespace}/{policy}"
    try:
        content = _content_of(ctx.kube, namespace, snapshot)
        if content is None:
            return
        _update(ctx.kube, content, holder, hold=False)
    except (ApiException, RuntimeError) as exc:
        log.warning("prefetch: %s could not release %s: %s", holder, snapshot, exc)
        return
    if ctx.prefetch_marked.get(holder, ("", ""))[1] == content:
        ctx.prefetch_marked.pop(holder, None)
    log.info("prefetch: %s releases %s", holder, content)
