"""`podsnap-operator`: run the operator (kopf) with its metrics endpoint."""

from __future__ import annotations

import argparse
import asyncio
import logging
import threading
from pathlib import Path

import kopf

from podsnap.operator.config import OperatorConfig
from podsnap.operator.handlers import registry
from podsnap.operator.kube import Credentials, Kube
from podsnap.operator.metrics import OperatorMetrics
from podsnap.operator.runtime import OperatorContext


def build_context(config: OperatorConfig) -> OperatorContext:
    credentials = Credentials.load(config.kubeconfig)
    return OperatorContext(
        config=config, credentials=credentials, kube=Kube(credentials.api_client()), metrics=OperatorMetrics()
    )


async def run(
    ctx: OperatorContext,
    *,
    stop_flag: asyncio.Event | threading.Event | None = None,
    ready_flag: asyncio.Event | threading.Event | None = None,
) -> None:
    """Run until `stop_flag` is set (or forever). Tests call this in a thread with their own context."""
    port = ctx.config.health_port
    liveness = f"http://0.0.0.0:{port}/healthz" if port else None
    await kopf.operator(
        registry=registry,
        memo=kopf.Memo(podsnap=ctx),
        clusterwide=True,
        standalone=True,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
        liveness_endpoint=liveness,
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="podsnap-operator", description=__doc__)
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else in-cluster)")
    parser.add_argument("--webhook-port", type=int, help="pod-create webhook port (0: off; default 9443)")
    parser.add_argument("--webhook-cert-dir", type=Path, help="directory with tls.crt and tls.key")
    parser.add_argument("--metrics-port", type=int, help="Prometheus /metrics port (0: off; default 8080)")
    parser.add_argument("--seccomp-profile", help="Localhost seccomp profile for capture pods")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = OperatorConfig.from_env()
    if args.kubeconfig:
        config.kubeconfig = args.kubeconfig
    if args.webhook_port is not None:
        config.webhook_port = args.webhook_port
    if args.webhook_cert_dir is not None:
        config.webhook_cert_dir = args.webhook_cert_dir
    if args.metrics_port is not None:
        config.metrics_port = args.metrics_port
    if args.seccomp_profile is not None:
        config.seccomp_profile = args.seccomp_profile or None
    ctx = build_context(config)
    ctx.metrics.serve(config.metrics_port)
    asyncio.run(run(ctx))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
