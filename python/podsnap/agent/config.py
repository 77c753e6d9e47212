"""Agent settings, from the environment the chart's DaemonSet sets (names in `podsnap.contract`) and flags."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from podsnap import contract as c
from podsnap.kube.env import ConfigError, env_path, env_port, env_str, log_level


@dataclass
class AgentConfig:
    node_name: str
    kubeconfig: str | None = None
    artifact_root: Path = Path(c.ARTIFACT_ROOT_DEFAULT)
    #: the host's /proc (the agent runs with hostPID, so its own /proc is the host's)
    proc_root: Path = Path("/proc")
    #: the host's cgroup filesystem (in a container its own /sys/fs/cgroup shows only the container's)
    cgroup_root: Path = Path("/sys/fs/cgroup")
    #: holds `key`, which verifies the capture and restore tokens of podsnap's pods (shared with the operator)
    token_key_dir: Path = Path(c.TOKEN_KEY_DIR_DEFAULT)
    metrics_port: int = 8080
    health_port: int = 8081
    log_level: str = "info"
    #: seconds between the cheap checks of each Ready artifact of this node (missing or tampered files)
    verify_interval_s: float = 60.0

    @property
    def logs_dir(self) -> Path:
        """Logs of failed captures and restores, on the artifact volume (they outlive the agent's pod), per node."""
        return self.artifact_root / ".logs" / self.node_name

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AgentConfig:
        node = env_str(c.ENV_NODE_NAME, "", environ)
        if not node:
            raise ConfigError(
                f"{c.ENV_NODE_NAME} is not set: give the agent its node (downward API fieldRef spec.nodeName)"
            )
        return cls(
            node_name=node,
            kubeconfig=env_str("KUBECONFIG", "", environ) or None,
            artifact_root=env_path(c.ENV_ARTIFACT_ROOT, c.ARTIFACT_ROOT_DEFAULT, environ),
            cgroup_root=env_path(c.ENV_CGROUP_ROOT, "/sys/fs/cgroup", environ),
            token_key_dir=env_path(c.ENV_TOKEN_KEY_DIR, c.TOKEN_KEY_DIR_DEFAULT, environ),
            metrics_port=env_port(c.ENV_METRICS_PORT, 8080, environ),
            health_port=env_port(c.ENV_HEALTH_PORT, 8081, environ),
            log_level=log_level(c.ENV_LOG_LEVEL, "info", environ),
        )
