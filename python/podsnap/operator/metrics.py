"""Prometheus metrics of the operator (its own registry: see podsnap.kube.metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from podsnap.kube.metrics import Metrics

CAPTURE_BUCKETS = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600)


class OperatorMetrics(Metrics):
    def __init__(self) -> None:
        super().__init__()
        self.capture_seconds = Histogram(
            "podsnap_operator_capture_duration_seconds",
            "SnapshotJob start to capture complete (includes the worker's warm-up)",
            buckets=CAPTURE_BUCKETS,
            registry=self.registry,
        )
        self.capture_failures = Counter(
            "podsnap_operator_capture_failures_total",
            "SnapshotJobs and PodSnapshots that failed, by reason",
            ["kind", "reason"],
            registry=self.registry,
        )
        self.capture_bytes = Counter(
            "podsnap_operator_captured_bytes_total", "Bytes of artifacts that became Ready", registry=self.registry
        )
        self.pods_shaped = Counter(
            "podsnap_operator_restore_pods_shaped_total",
            "Pods the webhook shaped for restore",
            registry=self.registry,
        )
        self.pods_cold = Counter(
            "podsnap_operator_cold_pods_total",
            "Pods of a policy that started cold (checkpoint not Ready, or template changed), by reason",
            ["reason"],
            registry=self.registry,
        )
        self.admission_denied = Counter(
            "podsnap_operator_admission_denied_total",
            "Requests the validating webhook denied, by kind of object",
            ["kind"],
            registry=self.registry,
        )
