"""Operator settings, from the environment the chart sets (names in `podsnap.contract`) and flags."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from podsnap import contract as c
from podsnap.kube.env import ConfigError, env_choice, env_path, env_port, env_seconds, env_str, log_level
from podsnap.workload.engines.checkpoint_env import COMMON

#: the webhook handler's id; kopf serves it at `<prefix>/<id>`, so the chart's path must end with it
WEBHOOK_PATH_ID = "mutate-pods"
SCHEDULING_GATE_MODES = ("auto", "on", "off")
#: the checkpoint-safe environment without PODSNAP_CHECKPOINT_ENV (the chart's defaults are the same)
DEFAULT_CHECKPOINT_ENV = {v.name: v.value for v in COMMON}


@dataclass
class OperatorConfig:
    kubeconfig: str | None = None
    #: Localhost seccomp profile of capture pods (None: none)
    seccomp_profile: str | None = None
    #: 0 disables the webhook server (failurePolicy Ignore: new pods then start cold)
    webhook_port: int = 9443
    webhook_host: str = "0.0.0.0"
    webhook_path: str = f"/{WEBHOOK_PATH_ID}"
    webhook_cert_dir: Path = Path(c.WEBHOOK_CERT_DIR_DEFAULT)
    #: how often the webhook's certificate files are checked for a renewal (reloaded in place when changed)
    webhook_cert_check_s: float = 10.0
    #: holds `key`, which signs the capture and restore tokens of podsnap's pods (shared with the agents)
    token_key_dir: Path = Path(c.TOKEN_KEY_DIR_DEFAULT)
    metrics_port: int = 8080
    #: /healthz for the kubelet's probes (0: off)
    health_port: int = 8081
    log_level: str = "info"
    #: "auto" (pod scheduling gates where the server has them), "on", "off" (hold replicas at zero)
    scheduling_gates: str = "auto"
    #: the first retry of a failed capture waits this long; each next one twice as long (policy.RETRY_MAX_S at most)
    capture_retry_base_s: float = 30.0
    #: what the pod webhook sets on the target container of capture and restore pods (operator/safe_env.py);
    #: None: nothing (workload.checkpointEnv.enabled false)
    checkpoint_env: dict[str, str] | None = field(default_factory=lambda: dict(DEFAULT_CHECKPOINT_ENV))
    #: restore pods: seconds to wait for the node agent to begin the restore, then start cold
    restore_pickup_timeout_s: int = c.RESTORE_TIMEOUT_DEFAULT_S
    #: restore pods: seconds a restore that has begun may take, then the container restarts cold
    restore_max_s: int = c.RESTORE_MAX_DEFAULT_S
    #: seconds a content being deleted waits for its node's agent; then another node's agent removes the
    #: artifact (operator/orphans.py)
    cleanup_handover_s: int = c.CLEANUP_HANDOVER_DEFAULT_S
    #: restore pods get a node affinity to nodes whose agent labelled them with the artifact's facts
    #: (operator/placement.py; values.yaml placement.enabled)
    placement: bool = True

    @property
    def webhook_prefix(self) -> str:
        path = "/" + self.webhook_path.strip("/")
        if path.rsplit("/", 1)[-1] != WEBHOOK_PATH_ID:
            raise ConfigError(f"{c.ENV_WEBHOOK_PATH}={self.webhook_path!r}: the path must end with /{WEBHOOK_PATH_ID}")
        return path[: -len(WEBHOOK_PATH_ID) - 1]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> OperatorConfig:
        return cls(
            kubeconfig=env_str("KUBECONFIG", "", environ) or None,
            seccomp_profile=env_str(c.ENV_SECCOMP_PROFILE, "", environ) or None,
            webhook_port=env_port(c.ENV_WEBHOOK_PORT, 9443, environ),
            webhook_path=env_str(c.ENV_WEBHOOK_PATH, f"/{WEBHOOK_PATH_ID}", environ),
            webhook_cert_dir=env_path(c.ENV_WEBHOOK_CERT_DIR, c.WEBHOOK_CERT_DIR_DEFAULT, environ),
            token_key_dir=env_path(c.ENV_TOKEN_KEY_DIR, c.TOKEN_KEY_DIR_DEFAULT, environ),
            metrics_port=env_port(c.ENV_METRICS_PORT, 8080, environ),
            health_port=env_port(c.ENV_HEALTH_PORT, 8081, environ),
            log_level=log_level(c.ENV_LOG_LEVEL, "info", environ),
            scheduling_gates=env_choice(c.ENV_SCHEDULING_GATES, SCHEDULING_GATE_MODES, "auto", environ),
            checkpoint_env=checkpoint_env_from(environ),
            restore_pickup_timeout_s=env_seconds(c.ENV_RESTORE_TIMEOUT, c.RESTORE_TIMEOUT_DEFAULT_S, environ),
            restore_max_s=env_seconds(c.ENV_RESTORE_MAX, c.RESTORE_MAX_DEFAULT_S, environ),
            cleanup_handover_s=env_seconds(c.ENV_CLEANUP_HANDOVER, c.CLEANUP_HANDOVER_DEFAULT_S, environ),
            placement=env_choice(c.ENV_PLACEMENT, ("true", "false"), "true", environ) == "true",
        )


def checkpoint_env_from(environ: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """PODSNAP_CHECKPOINT_ENV, as the chart writes it from values.yaml `workload.checkpointEnv`."""
    raw = env_str(c.ENV_CHECKPOINT_ENV, "", environ)
    if not raw:
        return dict(DEFAULT_CHECKPOINT_ENV)
    shown = raw if len(raw) <= 80 else raw[:77] + "..."
    expected = 'expected JSON {"enabled": true|false, "env": {NAME: "value"}} (values.yaml workload.checkpointEnv)'
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        raise ConfigError(f"{c.ENV_CHECKPOINT_ENV}={shown!r}: {expected}") from None
    env = data.get("env") or {} if isinstance(data, dict) else None
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("enabled", True), bool)
        or not isinstance(env, dict)
        or not all(isinstance(k, str) and k and isinstance(v, str) for k, v in env.items())
    ):
        raise ConfigError(f"{c.ENV_CHECKPOINT_ENV}={shown!r}: {expected}")
    return dict(env) if data.get("enabled", True) else None
