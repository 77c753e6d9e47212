"""Agent settings, from the environment the chart's DaemonSet sets (names in `podsnap.contract`) and flags."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from podsnap import contract as c
from podsnap.agent.state_dir import JOURNAL
from podsnap.kube.env import ConfigError, env_choice, env_int, env_path, env_port, env_str, log_level

#: the node cache's defaults when the variables are unset (the chart always sets them)
CACHE_MAX_SIZE_DEFAULT = "200Gi"
CACHE_MIN_FREE_PERCENT_DEFAULT = 15


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

    #: the node-local artifact cache (agent/cache.py); None: no cache, every restore reads the volume
    cache_dir: Path | None = None
    cache_max_bytes: int = 200 << 30
    cache_min_free_percent: int = CACHE_MIN_FREE_PERCENT_DEFAULT
    #: artifacts copied into the cache at once, for prefetch and after restores; 0: no prefetch watch
    prefetch_concurrency: int = 1
    #: label this node with the facts the restore gates compare (node_labels.py; values.yaml placement.enabled)
    placement: bool = True
    #: node-local state only this node's agent writes, kept across its restarts (agent/state_dir.py;
    #: values.yaml agent.stateDir): the capture journal and the restore records (restore_record.py)
    state_dir: Path = Path(c.STATE_DIR_IN_AGENT)

    @property
    def logs_dir(self) -> Path:
        """Logs of failed captures and restores, on the artifact volume (they outlive the agent's pod), per node."""
        return self.artifact_root / ".logs" / self.node_name

    @property
    def journal_dir(self) -> Path:
        """The journal records of this node's captures in flight (engine/_journal.py): in the node-local state
        directory, so they outlive the agent's pod (a restarted agent recovers the sources they name) and
        nobody but this node's agent can write one (never the shared artifact volume: a record makes this
        agent act on a PID of its node). Each record also names the boot it was written in."""
        return self.state_dir / JOURNAL

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
            cache_dir=env_path(c.ENV_CACHE_DIR, "", environ) if env_str(c.ENV_CACHE_DIR, "", environ) else None,
            cache_max_bytes=_quantity(c.ENV_CACHE_MAX_SIZE, CACHE_MAX_SIZE_DEFAULT, environ),
            cache_min_free_percent=_bounded(
                c.ENV_CACHE_MIN_FREE_PERCENT, CACHE_MIN_FREE_PERCENT_DEFAULT, 0, 90, environ
            ),
            prefetch_concurrency=_bounded(c.ENV_PREFETCH_CONCURRENCY, 1, 0, 64, environ),
            placement=env_choice(c.ENV_PLACEMENT, ("true", "false"), "true", environ) == "true",
            state_dir=_absolute(c.ENV_STATE_DIR, c.STATE_DIR_IN_AGENT, environ),
        )


def _absolute(name: str, default: str, environ: Mapping[str, str] | None) -> Path:
    path = env_path(name, default, environ)
    if not path.is_absolute():
        raise ConfigError(f"{name}={str(path)!r}: expected an absolute path")
    return path


def _quantity(name: str, default: str, environ: Mapping[str, str] | None) -> int:
    """A Kubernetes quantity of bytes (e.g. 200Gi, 500G), at least 1 MiB."""
    from kubernetes.utils.quantity import parse_quantity

    raw = env_str(name, default, environ)
    try:
        value = int(parse_quantity(raw))
    except (ValueError, TypeError, ArithmeticError):
        raise ConfigError(f"{name}={raw!r}: expected a size as a Kubernetes quantity, e.g. 200Gi") from None
    if value < 1 << 20:
        raise ConfigError(f"{name}={raw!r}: expected at least 1Mi")
    return value


def _bounded(name: str, default: int, low: int, high: int, environ: Mapping[str, str] | None) -> int:
    value = env_int(name, default, environ)
    if not low <= value <= high:
        raise ConfigError(f"{name}={str(value)!r}: expected an integer from {low} to {high}")
    return value
