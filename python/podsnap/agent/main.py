"""`podsnap-agent`: the node agent (kopf, this node's contents and restore pods) with its metrics."""

from __future__ import annotations

import functools
import os

from podsnap import contract as c
from podsnap.agent.config import AgentConfig
from podsnap.agent.executor import Executor
from podsnap.agent.handlers import registry
from podsnap.agent.metrics import AgentMetrics
from podsnap.agent.runtime import AgentContext
from podsnap.kube import entrypoint
from podsnap.kube.client import Credentials, Kube
from podsnap.kube.tokens import TokenKey


def engine_executor(config: AgentConfig) -> Executor:
    """The real executor, configured from the agent's settings (the host's cgroups, the logs dir)."""
    from podsnap.agent.engine_executor import EngineExecutor

    return EngineExecutor(cgroup_root=config.cgroup_root, log_dir=config.logs_dir)


def build_context(config: AgentConfig, executor: Executor | None = None) -> AgentContext:
    """`executor` defaults to the engine; tests that cannot run CRIU pass a recording stand-in."""
    if executor is None:
        executor = engine_executor(config)
    credentials = Credentials.load(config.kubeconfig)
    return AgentContext(
        config=config,
        credentials=credentials,
        kube=Kube(credentials.api_client()),
        executor=executor,
        metrics=AgentMetrics(),
        tokens=TokenKey.load(config.token_key_dir),
    )


#: run(ctx, stop_flag=None, ready_flag=None): the handlers until stop_flag is set; tests run it in a thread
run = functools.partial(entrypoint.run_kopf, registry)


def main(argv: list[str] | None = None) -> int:
    parser = entrypoint.parser("podsnap-agent", __doc__)
    parser.add_argument("--node-name", help=f"this node (default: ${c.ENV_NODE_NAME})")
    args = parser.parse_args(argv)
    environ = dict(os.environ)
    if args.node_name:
        environ[c.ENV_NODE_NAME] = args.node_name
    config = AgentConfig.from_env(environ)
    if args.kubeconfig:
        config.kubeconfig = args.kubeconfig
    entrypoint.configure_logging(config.log_level, verbose=args.verbose)
    ctx = build_context(config)
    return entrypoint.serve(registry, ctx)


if __name__ == "__main__":
    raise SystemExit(main())
