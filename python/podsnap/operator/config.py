"""Operator settings, from the environment the chart sets (names in `podsnap.contract`) and flags."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from podsnap import contract as c

ENV_POLL_INTERVAL = "PODSNAP_POLL_INTERVAL"
ENV_SCHEDULING_GATES = "PODSNAP_SCHEDULING_GATES"
#: the webhook handler's id; kopf serves it at `<prefix>/<id>`, so the chart's path must end with it
WEBHOOK_PATH_ID = "mutate-pods"


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    try:
        return int(raw) if raw else default
    except ValueError:
        raise SystemExit(f"{name}={raw!r}: expected an integer") from None


@dataclass
class OperatorConfig:
    kubeconfig: str | None = None
    namespace: str = "podsnap-system"
    seccomp_profile: str | None = None
    #: only for artifacts of contents whose node is gone, and only where the PVC is mounted
    artifact_root: Path = Path(c.ARTIFACT_ROOT_DEFAULT)
    #: 0 disables the webhook server (failurePolicy Ignore: new pods then start cold)
    webhook_port: int = 9443
    webhook_host: str = "0.0.0.0"
    webhook_path: str = f"/{WEBHOOK_PATH_ID}"
    webhook_cert_dir: Path = Path(c.WEBHOOK_CERT_DIR_DEFAULT)
    metrics_port: int = 8080
    #: /healthz for the kubelet's probes (0: off)
    health_port: int = 8081
    log_level: str = "info"
    #: "auto" (pod scheduling gates where the server has them), "on", "off" (hold replicas at zero)
    scheduling_gates: str = "auto"

    @property
    def webhook_prefix(self) -> str:
        path = "/" + self.webhook_path.strip("/")
        if path.rsplit("/", 1)[-1] != WEBHOOK_PATH_ID:
            raise SystemExit(f"{c.ENV_WEBHOOK_PATH}={self.webhook_path!r}: the path must end with /{WEBHOOK_PATH_ID}")
        return path[: -len(WEBHOOK_PATH_ID) - 1]

    @classmethod
    def from_env(cls) -> OperatorConfig:
        return cls(
            kubeconfig=os.environ.get("KUBECONFIG") or None,
            namespace=os.environ.get(c.ENV_NAMESPACE) or "podsnap-system",
            seccomp_profile=os.environ.get(c.ENV_SECCOMP_PROFILE) or None,
            artifact_root=Path(os.environ.get(c.ENV_ARTIFACT_ROOT) or c.ARTIFACT_ROOT_DEFAULT),
            webhook_port=env_int(c.ENV_WEBHOOK_PORT, 9443),
            webhook_path=os.environ.get(c.ENV_WEBHOOK_PATH) or f"/{WEBHOOK_PATH_ID}",
            webhook_cert_dir=Path(os.environ.get(c.ENV_WEBHOOK_CERT_DIR) or c.WEBHOOK_CERT_DIR_DEFAULT),
            metrics_port=env_int(c.ENV_METRICS_PORT, 8080),
            health_port=env_int(c.ENV_HEALTH_PORT, 8081),
            log_level=os.environ.get(c.ENV_LOG_LEVEL) or "info",
            scheduling_gates=os.environ.get(ENV_SCHEDULING_GATES) or "auto",
        )
