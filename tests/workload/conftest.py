"""Workload tests; the CLI flow tests use the shared CRIU fixture."""

from tests.support.criu import criu  # noqa: F401
