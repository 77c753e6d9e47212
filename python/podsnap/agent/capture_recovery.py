"""Captures an earlier agent of this node died in the middle of: on start, before this agent captures
anything, the executor gives each source back what its capture took (the engine's journal: a CUDA-locked
or checkpointed source is restored and unlocked, a tree CRIU left stopped is continued; a process that
merely reuses the source's PID is never touched), and each content is Failed with reason AgentRestarted,
its message saying what was recovered. The policy captures again with backoff.

Only records of the node-local state directory are recovered (agent/state_dir.py): a record on the shared
artifact volume, where agents before it kept them, is removed unread.
"""

from __future__ import annotations

from typing import Any

import kopf

from podsnap import contract as c
from podsnap.agent.artifacts import snapshot_of
from podsnap.agent.executor import CaptureRecovered
from podsnap.agent.runtime import AgentContext
from podsnap.agent.state_dir import UnsafeStateDir, drop_volume_journal
from podsnap.kube import conditions
from podsnap.kube.conditions import Condition
from podsnap.kube.events import event
from podsnap.kube.reporter import cr_status, report


def message_of(found: CaptureRecovered) -> str:
    return (
        f"the node agent restarted during the capture (at step {found.step}); {found.summary}. "
        "This capture is abandoned; capture again (a SnapshotPolicy does, with backoff)"
    )


def recover_captures(ctx: AgentContext, logger: kopf.Logger | Any) -> list[CaptureRecovered]:
    """Recover every capture left in flight on this node; fail its content (when it still exists and is not
    Ready). Returns what was found."""
    try:
        dropped = drop_volume_journal(ctx.config.artifact_root, ctx.config.node_name)
    except OSError as exc:  # never read either way; the next start tries again
        logger.warning("could not remove the old capture journal on the artifact volume: %s", exc)
        dropped = []
    if dropped:
        logger.warning(
            "removed %d capture journal record(s) from the artifact volume (%s), unread: anyone who can write the "
            "volume could have planted them, so they are never recovered from; the journal is node-local now (%s)",
            len(dropped),
            ", ".join(dropped),
            ctx.config.journal_dir,
        )
    try:
        found = ctx.executor.recover_captures()
    except UnsafeStateDir as exc:
        logger.error("captures left in flight were not recovered: %s", exc)
        return []
    for item in found:
        message = message_of(item)
        log = logger.error if item.problems else logger.warning
        log("capture of %s: %s", item.content or "(unknown content)", message)
        ctx.metrics.capture_recoveries.labels("problems" if item.problems else "recovered").inc()
        content = ctx.kube.get_cr(c.PLURAL_POD_SNAPSHOT_CONTENTS, item.content) if item.content else None
        if content is None:
            continue
        conds = (content.get("status") or {}).get("conditions")
        if conditions.is_true(conds, c.COND_READY):
            continue  # published before the agent died: the artifact is whole and stays
        report(
            content,
            Condition(c.COND_FAILED, True, c.REASON_AGENT_RESTARTED, message),
            Condition(c.COND_READY, False, c.REASON_AGENT_RESTARTED, message),
            write=cr_status(ctx.kube, c.PLURAL_POD_SNAPSHOT_CONTENTS, item.content),
            warning=True,
            count=ctx.metrics.failures.labels("capture", c.REASON_AGENT_RESTARTED),
        )
        event(snapshot_of(content), type_="Warning", reason=c.REASON_AGENT_RESTARTED, message=message)
    return found
