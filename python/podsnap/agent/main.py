"""`podsnap-agent`: the node agent (kopf, this node's contents and restore pods) with its metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from podsnap import contract as c
from podsnap.agent.cache import ArtifactCache, CacheMetrics, IOGate
from podsnap.agent.cached_executor import CachingExecutor, Filler
from podsnap.agent.config import AgentConfig
from podsnap.agent.executor import Executor
from podsnap.agent.handlers import registry
from podsnap.agent.metrics import AgentMetrics
from podsnap.agent.node_labels import labelling
from podsnap.agent.on_prefetch import prefetch_loop
from podsnap.agent.runtime import AgentContext
from podsnap.agent.state_dir import UnsafeStateDir, private_dir
from podsnap.kube import entrypoint
from podsnap.kube.client import Credentials, Kube
from podsnap.kube.env import ConfigError
from podsnap.kube.tokens import TokenKey

log = logging.getLogger(__name__)


def engine_executor(config: AgentConfig) -> Executor:
    """The real executor, configured from the agent's settings (the host's cgroups, the logs dir)."""
    from podsnap.agent.engine_executor import EngineExecutor

    return EngineExecutor(cgroup_root=config.cgroup_root, log_dir=config.logs_dir, journal_dir=config.journal_dir)


def build_context(
    config: AgentConfig, executor: Executor | None = None, node_facts: Callable[[], dict[str, Any]] | None = None
) -> AgentContext:
    """`executor` defaults to the engine, `node_facts` (what the Node is labelled with) to this host's; tests
    that cannot run CRIU pass stand-ins. With a cache directory configured, restores go through the
    node-local artifact cache."""
    if executor is None:
        executor = engine_executor(config)
    if node_facts is None:
        from podsnap.agent.engine_executor import node_facts as host_facts

        node_facts = host_facts
    credentials = Credentials.load(config.kubeconfig)
    metrics = AgentMetrics()
    cache = filler = None
    if config.cache_dir is not None:
        cache = ArtifactCache(
            config.cache_dir,
            executor,
            max_bytes=config.cache_max_bytes,
            min_free_percent=config.cache_min_free_percent,
            metrics=CacheMetrics(metrics.registry),
        )
        filler = Filler(cache, IOGate(), concurrency=max(1, config.prefetch_concurrency))
        executor = CachingExecutor(executor, cache, filler)
    return AgentContext(
        config=config,
        credentials=credentials,
        kube=Kube(credentials.api_client()),
        executor=executor,
        metrics=metrics,
        tokens=TokenKey.load(config.token_key_dir),
        cache=cache,
        filler=filler,
        node_facts=node_facts,
    )


@contextlib.contextmanager
def node_cache(ctx: AgentContext) -> Iterator[None]:
    """The node cache while the agent runs: opened (half-done fills of an earlier agent removed), the
    prefetch watch beside the agent's own loop, and every fill ended when the agent stops."""
    if ctx.cache is None or ctx.filler is None:
        yield
        return
    cache = ctx.cache.open()
    config = ctx.config
    log.info(
        "artifact cache at %s: %d of at most %d bytes, keeping %d%% of its filesystem free; prefetch %s",
        cache.root,
        cache.used_bytes,
        cache.max_bytes,
        cache.min_free_percent,
        f"{config.prefetch_concurrency} at a time" if config.prefetch_concurrency else "off",
    )
    try:
        if config.prefetch_concurrency:
            with prefetch_loop(ctx):
                yield
        else:
            yield
    finally:
        ctx.filler.stop()


async def run(
    ctx: AgentContext,
    *,
    stop_flag: asyncio.Event | threading.Event | None = None,
    ready_flag: asyncio.Event | threading.Event | None = None,
) -> None:
    """The handlers until stop_flag is set (tests run it in a thread), with the node cache when configured."""
    with node_cache(ctx), labelling(ctx):
        await entrypoint.run_kopf(registry, ctx, stop_flag=stop_flag, ready_flag=ready_flag)


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
    try:
        # before anything runs: the journal a restarted agent recovers from must be this agent's own
        private_dir(config.journal_dir)
    except UnsafeStateDir as exc:
        raise ConfigError(str(exc)) from None
    ctx = build_context(config)
    ctx.metrics.serve(config.metrics_port)
    asyncio.run(run(ctx))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
