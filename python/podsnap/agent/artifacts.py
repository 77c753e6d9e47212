"""Artifacts that stop being usable: a Ready PodSnapshotContent whose artifact is missing or fails
verification is Failed from then on (reason ArtifactLost), so its snapshot and policy stop being Ready,
new pods start cold, and the policy captures again.

Found two ways: a restore that fails on the artifact (any agent, any node: the volume is shared), and a
periodic cheap check (the manifest against its recorded digest, every file's type and size; no hashing)
by the agent of the content's node.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Mapping
from typing import Any

import kopf

from podsnap import contract as c
from podsnap.agent.executor import ArtifactUnusable, ExecutionError
from podsnap.agent.on_content import CONTENTS, _mine, artifact_dir
from podsnap.agent.runtime import AgentContext, ctx_of, registry
from podsnap.agent.volume_sweep import remove_leftovers
from podsnap.kube import conditions
from podsnap.kube.conditions import Condition
from podsnap.kube.events import event
from podsnap.kube.reporter import cr_status, report

#: how often the timer looks; each content is checked at most every AgentConfig.verify_interval_s
TICK_S = 5.0
#: failed runs' logs kept per node (the oldest go first)
KEEP_LOGS = 50


def snapshot_of(content: Mapping[str, Any]) -> dict[str, Any]:
    ref = (content.get("spec") or {}).get("podSnapshotRef") or {}
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.KIND_POD_SNAPSHOT,
        "metadata": {k: ref[k] for k in ("name", "namespace", "uid") if k in ref},
    }


def invalidate(ctx: AgentContext, content: Mapping[str, Any], cause: str) -> None:
    """The content's artifact is unusable: Failed/ArtifactLost on the content, an Event on its snapshot too."""
    name = content["metadata"]["name"]
    message = f"artifact {(content.get('spec') or {}).get('artifactPath')} is unusable: {cause}"
    report(
        {"apiVersion": c.API_VERSION, "kind": c.KIND_POD_SNAPSHOT_CONTENT, "metadata": content["metadata"]},
        Condition(c.COND_FAILED, True, c.REASON_ARTIFACT_LOST, message),
        Condition(c.COND_READY, False, c.REASON_ARTIFACT_LOST, message),
        write=cr_status(ctx.kube, c.PLURAL_POD_SNAPSHOT_CONTENTS, name),
        warning=True,
        count=ctx.metrics.failures.labels("artifact", c.REASON_ARTIFACT_LOST),
    )
    event(snapshot_of(content), type_="Warning", reason=c.REASON_ARTIFACT_LOST, message=message)


def check(ctx: AgentContext, content: Mapping[str, Any]) -> bool:
    """Whether the content's artifact passes the cheap check; an unusable one is invalidated."""
    spec, status = content.get("spec") or {}, content.get("status") or {}
    digest = str((status.get("artifact") or {}).get("digest") or "")
    try:
        ctx.executor.check(artifact_dir(ctx.config.artifact_root, spec.get("artifactPath") or ""), digest)
    except ArtifactUnusable as exc:
        invalidate(ctx, content, str(exc))
        return False
    except ExecutionError:  # a path outside the root: not this agent's to judge
        return True
    return True


def _ready_and_mine(status: Mapping[str, Any], labels: Mapping[str, str], memo: Any, **kw: Any) -> bool:
    conds = (status or {}).get("conditions")
    return _mine(labels=labels, memo=memo, **kw) and conditions.is_true(conds, c.COND_READY)


@kopf.timer(*CONTENTS, registry=registry, interval=TICK_S, when=_ready_and_mine)
def artifact_check(*, body: kopf.Body, name: str, memo: Any, logger: kopf.Logger, **_: Any) -> None:
    ctx = ctx_of(memo)
    now = time.monotonic()
    with ctx.lock:
        if now - ctx.checked.get(name, float("-inf")) < ctx.config.verify_interval_s:
            return
        ctx.checked[name] = now
    if not check(ctx, body):
        logger.warning("artifact of %s is unusable: marked %s", name, c.REASON_ARTIFACT_LOST)
    # a Ready content's capture is over and its path is never captured into again, so anything left next
    # to it is a leftover of an earlier agent
    try:
        target = artifact_dir(ctx.config.artifact_root, (body.get("spec") or {}).get("artifactPath") or "")
    except ExecutionError:
        return
    for leftover in remove_leftovers(ctx.config.artifact_root, target):
        logger.warning("removed %s, left next to the artifact of %s", leftover, name)


def sweep_leftovers(ctx: AgentContext) -> list[str]:
    """Remove what an earlier agent of this node left half done next to its contents' artifacts: capture
    staging dirs and artifacts renamed aside for deletion. Run at start, before this process begins any
    capture (kopf runs startup handlers before it watches anything), so none of them is in use. Only this
    node's contents are looked at: the volume may be shared, and another node's staging may be live.
    Returns the paths removed, relative to the artifact root."""
    root = ctx.config.artifact_root
    found = ctx.kube.custom.list_cluster_custom_object(
        c.GROUP,
        c.VERSION,
        c.PLURAL_POD_SNAPSHOT_CONTENTS,
        label_selector=f"{c.LABEL_SNAPSHOT_NODE}={ctx.config.node_name}",
    )
    removed: list[str] = []
    for content in found.get("items") or []:
        rel = (content.get("spec") or {}).get("artifactPath")
        if not rel:
            continue
        try:
            target = artifact_dir(root, rel)
        except ExecutionError:
            continue
        removed.extend(remove_leftovers(root, target))
    return sorted(removed)


def prune_logs(ctx: AgentContext) -> None:
    """Keep the newest KEEP_LOGS failed runs' logs of this node."""
    logs = ctx.config.logs_dir
    if not logs.is_dir():
        return
    runs = sorted((p for p in logs.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in runs[KEEP_LOGS:]:
        shutil.rmtree(old, ignore_errors=True)
