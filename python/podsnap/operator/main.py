"""`podsnap-operator`: run the operator (kopf) with its metrics endpoint."""

from __future__ import annotations

import functools
from pathlib import Path

from podsnap.kube import entrypoint
from podsnap.kube.client import Credentials, Kube
from podsnap.kube.tokens import TokenKey
from podsnap.operator.config import OperatorConfig
from podsnap.operator.handlers import registry
from podsnap.operator.metrics import OperatorMetrics
from podsnap.operator.runtime import OperatorContext


def build_context(config: OperatorConfig) -> OperatorContext:
    credentials = Credentials.load(config.kubeconfig)
    return OperatorContext(
        config=config,
        credentials=credentials,
        kube=Kube(credentials.api_client()),
        metrics=OperatorMetrics(),
        tokens=TokenKey.load(config.token_key_dir),
    )


#: run(ctx, stop_flag=None, ready_flag=None): the handlers until stop_flag is set; tests run it in a thread
run = functools.partial(entrypoint.run_kopf, registry)


def main(argv: list[str] | None = None) -> int:
    parser = entrypoint.parser("podsnap-operator", __doc__)
    parser.add_argument("--webhook-port", type=int, help="pod-create webhook port (0: off; default 9443)")
    parser.add_argument("--webhook-cert-dir", type=Path, help="directory with tls.crt and tls.key")
    parser.add_argument("--metrics-port", type=int, help="Prometheus /metrics port (0: off; default 8080)")
    parser.add_argument("--seccomp-profile", help="Localhost seccomp profile for capture pods")
    args = parser.parse_args(argv)
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
    entrypoint.configure_logging(config.log_level, verbose=args.verbose)
    ctx = build_context(config)
    return entrypoint.serve(registry, ctx)


if __name__ == "__main__":
    raise SystemExit(main())
