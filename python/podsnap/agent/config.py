"""Agent settings, from the environment (the chart's DaemonSet sets them) and flags."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from podsnap import contract as c
from podsnap.operator.config import env_int

ENV_PROC_ROOT = "PODSNAP_PROC_ROOT"


@dataclass
class AgentConfig:
    node_name: str
    kubeconfig: str | None = None
    artifact_root: Path = Path(c.ARTIFACT_ROOT_DEFAULT)
    #: the host's /proc (the agent runs with hostPID, so its own /proc is the host's)
    proc_root: Path = Path("/proc")
    metrics_port: int = 8080
    health_port: int = 8081
    log_level: str = "info"

    @classmethod
    def from_env(cls) -> AgentConfig:
        node = os.environ.get(c.ENV_NODE_NAME, "")
        if not node:
            raise SystemExit(
                f"{c.ENV_NODE_NAME} is not set: give the agent its node (downward API fieldRef spec.nodeName)"
            )
        return cls(
            node_name=node,
            kubeconfig=os.environ.get("KUBECONFIG") or None,
            artifact_root=Path(os.environ.get(c.ENV_ARTIFACT_ROOT) or c.ARTIFACT_ROOT_DEFAULT),
            proc_root=Path(os.environ.get(ENV_PROC_ROOT) or "/proc"),
            metrics_port=env_int(c.ENV_METRICS_PORT, 8080),
            health_port=env_int(c.ENV_HEALTH_PORT, 8081),
            log_level=os.environ.get(c.ENV_LOG_LEVEL) or "info",
        )
