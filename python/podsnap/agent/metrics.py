"""Prometheus metrics of the node agent (its own registry: see podsnap.kube.metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from podsnap.kube.metrics import Metrics

SECONDS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)
BYTES = tuple(float(2**n) for n in range(20, 41, 2))  # 1 MiB .. 1 TiB


class AgentMetrics(Metrics):
    def __init__(self) -> None:
        super().__init__()
        self.pickup_seconds = Histogram(
            "podsnap_agent_pickup_seconds",
            "PodSnapshotContent creation to the agent starting its capture",
            buckets=SECONDS,
            registry=self.registry,
        )
        self.capture_seconds = Histogram(
            "podsnap_agent_capture_duration_seconds",
            "Capture (executor) duration",
            buckets=SECONDS,
            registry=self.registry,
        )
        self.capture_bytes = Histogram(
            "podsnap_agent_capture_bytes", "Artifact size per capture", buckets=BYTES, registry=self.registry
        )
        self.restore_seconds = Histogram(
            "podsnap_agent_restore_duration_seconds",
            "Restore duration, placeholder found to restore-complete written",
            buckets=SECONDS,
            registry=self.registry,
        )
        self.fallbacks = Counter(
            "podsnap_agent_restore_fallbacks_total",
            "Restore pods that started their worker cold instead (restoreFailurePolicy ColdStart), by cause",
            ["cause"],
            registry=self.registry,
        )
        self.capture_recoveries = Counter(
            "podsnap_agent_capture_recoveries_total",
            "Captures an earlier agent of this node died in; outcome: recovered (the source got back its CUDA "
            "state, or had nothing to get back) or problems (something could not be given back: see the log)",
            ["outcome"],
            registry=self.registry,
        )
        self.failures = Counter(
            "podsnap_agent_failures_total",
            "Failed captures and restores, by reason",
            ["op", "reason"],
            registry=self.registry,
        )
