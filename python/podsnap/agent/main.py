"""`podsnap-agent`: the node agent (kopf, this node's contents and restore pods) with its metrics."""

from __future__ import annotations

import argparse
import asyncio
import logging
import threading

import kopf

from podsnap.agent.config import AgentConfig
from podsnap.agent.executor import Executor
from podsnap.agent.handlers import registry
from podsnap.agent.metrics import AgentMetrics
from podsnap.agent.runtime import AgentContext
from podsnap.operator.kube import Credentials, Kube


def build_context(config: AgentConfig, executor: Executor | None = None) -> AgentContext:
    """`executor` defaults to the engine; tests that cannot run CRIU pass a recording stand-in."""
    if executor is None:
        from podsnap.agent.engine_executor import EngineExecutor

        executor = EngineExecutor()
    credentials = Credentials.load(config.kubeconfig)
    return AgentContext(
        config=config,
        credentials=credentials,
        kube=Kube(credentials.api_client()),
        executor=executor,
        metrics=AgentMetrics(),
    )


async def run(
    ctx: AgentContext,
    *,
    stop_flag: asyncio.Event | threading.Event | None = None,
    ready_flag: asyncio.Event | threading.Event | None = None,
) -> None:
    port = ctx.config.health_port
    await kopf.operator(
        registry=registry,
        memo=kopf.Memo(podsnap=ctx),
        clusterwide=True,
        standalone=True,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
        liveness_endpoint=f"http://0.0.0.0:{port}/healthz" if port else None,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="podsnap-agent", description=__doc__)
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else in-cluster)")
    parser.add_argument("--node-name", help="this node (default: $NODE_NAME)")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.node_name:
        import os

        os.environ.setdefault("NODE_NAME", args.node_name)
    config = AgentConfig.from_env()
    if args.kubeconfig:
        config.kubeconfig = args.kubeconfig
    level = "debug" if args.verbose else config.log_level
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ctx = build_context(config)
    ctx.metrics.serve(config.metrics_port)
    asyncio.run(run(ctx))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
