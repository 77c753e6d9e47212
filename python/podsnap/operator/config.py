"""Operator settings, from the environment the chart sets (names in `podsnap.contract`) and flags."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from podsnap import contract as c
from podsnap.kube.env import ConfigError, env_choice, env_path, env_port, env_str, log_level

#: the webhook handler's id; kopf serves it at `<prefix>/<id>`, so the chart's path must end with it
WEBHOOK_PATH_ID = "mutate-pods"
SCHEDULING_GATE_MODES = ("auto", "on", "off")


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
        )
