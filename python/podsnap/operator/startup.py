"""The operator's one startup handler (settings) and its login (credentials from the context)."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from typing import Any

import kopf
import kubernetes

from podsnap import contract as c
from podsnap.kube.entrypoint import register_login
from podsnap.kube.settings import apply_common
from podsnap.operator.config import OperatorConfig
from podsnap.operator.runtime import ENTRYPOINT, OperatorContext, ctx_of, registry
from podsnap.operator.webhook_server import ReloadingWebhookServer

#: kopf's own bookkeeping lives under this prefix, apart from the agent's (they share PodSnapshotContents)
PROGRESS_PREFIX = f"operator.{c.GROUP}"


log = logging.getLogger(__name__)


class NoWebhookServer:
    """An admission "server" that serves nothing, for an operator whose webhook is turned off."""

    async def __call__(self, fn: Any) -> AsyncIterator[Any]:
        await asyncio.Future()  # until the operator stops (then cancelled)
        yield {}  # never reached; makes this an async generator as kopf expects


def apply_settings(settings: kopf.OperatorSettings, config: OperatorConfig) -> None:
    apply_common(settings, finalizer=c.FINALIZER_SNAPSHOT, progress_prefix=PROGRESS_PREFIX)
    cert, key = config.webhook_cert_dir / "tls.crt", config.webhook_cert_dir / "tls.key"
    if config.webhook_port and cert.exists() and key.exists():
        settings.admission.server = ReloadingWebhookServer(
            addr=config.webhook_host,
            port=config.webhook_port,
            path=config.webhook_prefix or None,
            certfile=cert,
            pkeyfile=key,
            interval=config.webhook_cert_check_s,
        )
    else:
        if config.webhook_port:
            log.warning("webhook off: no %s / %s (mount the chart's webhook TLS Secret there)", cert, key)
        # kopf refuses to start with admission handlers and no server; with the webhook off, new pods start cold
        settings.admission.server = NoWebhookServer()
    # the chart owns the MutatingWebhookConfiguration; kopf must not rewrite it
    settings.admission.managed = None
    # of all pods, the operator watches only those the webhook could not place (operator/on_placement.py)
    settings.watching.label_selectors["v1", "pods"] = c.LABEL_PLACEMENT


@kopf.on.startup(registry=registry)
def startup(*, settings: kopf.OperatorSettings, memo: Any, logger: kopf.Logger, **_: Any) -> None:
    ctx = ctx_of(memo)
    apply_settings(settings, ctx.config)
    try:
        version = kubernetes.client.VersionApi(ctx.kube.client).get_code()
        ctx.server_minor = int(re.sub(r"\D", "", str(version.minor)) or 0)
    except Exception as exc:  # the version only picks a strategy; a wrong guess is the safe one (no gates)
        logger.warning("could not read the server version (%s); holding replicas instead of scheduling gates", exc)
    logger.info("podsnap operator started (server minor %s, gates %s)", ctx.server_minor, ctx.scheduling_gates)


register_login(registry, OperatorContext, ENTRYPOINT)
