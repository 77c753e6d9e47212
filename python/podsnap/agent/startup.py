"""The agent's startup handler: watch only this node's contents and restore pods (server-side selectors)."""

from __future__ import annotations

from typing import Any

import kopf

from podsnap import contract as c
from podsnap.agent.artifacts import prune_logs, sweep_leftovers
from podsnap.agent.capture_recovery import recover_captures
from podsnap.agent.config import AgentConfig
from podsnap.agent.runtime import ENTRYPOINT, AgentContext, ctx_of, registry
from podsnap.kube.entrypoint import register_login
from podsnap.kube.settings import apply_common

PROGRESS_PREFIX = f"agent.{c.GROUP}"


def apply_settings(settings: kopf.OperatorSettings, config: AgentConfig) -> None:
    # the content's artifact finalizer is this agent's: kopf removes it once the delete handler succeeds
    apply_common(settings, finalizer=c.FINALIZER_CONTENT_ARTIFACT, progress_prefix=PROGRESS_PREFIX)
    node = config.node_name
    settings.watching.label_selectors[c.GROUP, c.PLURAL_POD_SNAPSHOT_CONTENTS] = f"{c.LABEL_SNAPSHOT_NODE}={node}"
    settings.watching.label_selectors["v1", "pods"] = f"{c.LABEL_RESTORE}=true"
    settings.watching.field_selectors["v1", "pods"] = f"spec.nodeName={node}"


@kopf.on.startup(registry=registry)
def startup(*, settings: kopf.OperatorSettings, memo: Any, logger: kopf.Logger, **_: Any) -> None:
    ctx = ctx_of(memo)
    apply_settings(settings, ctx.config)
    ctx.config.artifact_root.mkdir(parents=True, exist_ok=True)
    ctx.config.logs_dir.mkdir(parents=True, exist_ok=True)
    prune_logs(ctx)
    # before any capture of this process: a source an earlier agent left CUDA-locked serves again
    recover_captures(ctx, logger)
    for leftover in sweep_leftovers(ctx):
        logger.warning("removed %s, left half done by an earlier agent of this node", leftover)
    logger.info("podsnap agent on node %s (artifacts under %s)", ctx.config.node_name, ctx.config.artifact_root)


register_login(registry, AgentContext, ENTRYPOINT)
