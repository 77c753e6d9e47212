"""The operator suite's fixtures: one control plane with the operator and one node agent running in threads
(tests/support/operator_env.py), and a namespace per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import ControlPlaneFactory
from tests.support.operator_env import Env, start_env


@pytest.fixture(scope="session")
def env(control_plane_factory: ControlPlaneFactory, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    started = start_env(control_plane_factory("operator"), tmp_path_factory.mktemp("operator-env"))
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def ns(env: Env, request: pytest.FixtureRequest) -> str:
    """A fresh namespace per test (names from the test, so objects are easy to find in the logs)."""
    name = request.node.name.lower().replace("_", "-")[:50].strip("-")
    return env.cluster.namespace(f"t-{name}"[:63].rstrip("-"))
