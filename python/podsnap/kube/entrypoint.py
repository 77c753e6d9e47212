"""The process around a component's kopf handlers, the same for the operator and the agent: flags and
logging, the metrics endpoint, kopf's loop with its liveness endpoint, and the component's context,
handed to every handler through kopf's `memo`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import threading
from pathlib import Path
from typing import Any, Protocol, TypeVar

import kopf

from podsnap.kube.client import Credentials
from podsnap.kube.metrics import Metrics

MEMO_KEY = "podsnap"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
T = TypeVar("T")


class Settings(Protocol):
    @property
    def health_port(self) -> int: ...

    @property
    def metrics_port(self) -> int: ...


class Context(Protocol):
    """What a component's context offers this module: its settings, credentials and metrics."""

    @property
    def config(self) -> Settings: ...

    @property
    def credentials(self) -> Credentials: ...

    @property
    def metrics(self) -> Metrics: ...


def context_of(memo: Any, kind: type[T], entrypoint: str) -> T:
    """The component context a handler runs with; a handler run outside its entrypoint stops at once."""
    ctx = memo.get(MEMO_KEY) if hasattr(memo, "get") else None
    if not isinstance(ctx, kind):
        raise kopf.PermanentError(f"{kind.__name__} missing from kopf's memo: start through {entrypoint}")
    return ctx


def register_login(registry: kopf.OperatorRegistry, kind: type[Context], entrypoint: str) -> None:
    """kopf logs in with the component's own credentials (a ServiceAccount token or a kubeconfig)."""

    @kopf.on.login(registry=registry)
    def login(*, memo: Any, **_: Any) -> kopf.ConnectionInfo:
        return context_of(memo, kind, entrypoint).credentials.connection_info()


async def run_kopf(
    registry: kopf.OperatorRegistry,
    ctx: Context,
    *,
    stop_flag: asyncio.Event | threading.Event | None = None,
    ready_flag: asyncio.Event | threading.Event | None = None,
) -> None:
    """Run the registry's handlers until `stop_flag` is set (or forever). Tests call this in a thread."""
    asyncio.get_running_loop().set_exception_handler(quiet_kopf_watch_close)
    port = ctx.config.health_port
    await kopf.operator(
        registry=registry,
        memo=kopf.Memo(**{MEMO_KEY: ctx}),
        clusterwide=True,
        # one replica each (the operator's Deployment recreates, one agent per node): no peering objects
        standalone=True,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
        liveness_endpoint=f"http://0.0.0.0:{port}/healthz" if port else None,
    )


def quiet_kopf_watch_close(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The loop's exception handler: kopf's own watch stream closed at shutdown is logged at debug level.

    On SIGTERM kopf can return while one of its watch generators is suspended inside its streaming
    block; asyncio's shutdown then closes that generator and reports the context manager's
    "generator didn't stop after athrow()" with a traceback, although nothing was lost: the stream was
    being torn down anyway. Any other error keeps asyncio's default report."""
    agen = context.get("asyncgen")
    code = getattr(agen, "ag_code", None)
    if code is not None and code.co_name == "infinite_watch" and "kopf" in Path(code.co_filename).parts:
        logging.getLogger(__name__).debug("kopf's watch stream closed at shutdown: %s", context.get("exception"))
        return
    loop.default_exception_handler(context)


def parser(prog: str, description: str | None) -> argparse.ArgumentParser:
    """The flags every component takes; each adds its own."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else in-cluster)")
    p.add_argument("-v", "--verbose", action="store_true", help="log at debug level (overrides the log level)")
    return p


def configure_logging(level: str, *, verbose: bool = False) -> None:
    logging.basicConfig(level="DEBUG" if verbose else level.upper(), format=LOG_FORMAT, force=True)


def serve(registry: kopf.OperatorRegistry, ctx: Context) -> int:
    """The component's process: /metrics, then kopf until it stops."""
    ctx.metrics.serve(ctx.config.metrics_port)
    asyncio.run(run_kopf(registry, ctx))
    return 0
