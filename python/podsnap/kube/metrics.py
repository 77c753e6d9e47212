"""Prometheus metrics: each component owns a registry, so the operator and the agent can share a process
(the tests run them so) without colliding."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, start_http_server


class Metrics:
    """Base of a component's metrics: its own registry and the /metrics endpoint."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()

    def serve(self, port: int) -> None:
        """Serve /metrics on `port` (0: off)."""
        if port:
            start_http_server(port, registry=self.registry)
