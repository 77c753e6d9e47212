"""Suite-wide settings: markers, tool discovery, and the one-line skip reasons.

Markers (declared in pytest.ini, `--strict-markers` is on):
  gpu      needs an NVIDIA GPU with the CUDA checkpoint API (the lent H200)
  cluster  needs a running Kubernetes cluster with podsnap's images (KUBECONFIG or `make cluster-up`)
  slow     takes more than a few seconds; runs by default, deselect with -m "not slow"
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.controlplane import ControlPlane

# the names below stay importable from here for suites that still do so
from tests.support.tools import REPO, TOOLS_BIN, gpu_missing_reason, require_tool, tool

__all__ = ["REPO", "TOOLS_BIN", "ControlPlaneFactory", "gpu_missing_reason", "require_tool", "tool"]

#: a run fails when a required suite (chart, engine, operator, e2e) was selected but skipped entirely; a run
#: with fault tests ends with the count of those survived
pytest_plugins = ["tests.support.required_suites", "tests.support.fault_count"]


def pytest_addoption(parser: pytest.Parser) -> None:
    # the e2e suite's one option of its own (tests/e2e/support/config.py); declared here, the conftest
    # pytest always loads, so `pytest tests --e2e-worker gpu` works as well as `pytest tests/e2e ...`
    parser.getgroup("podsnap e2e").addoption(
        "--e2e-worker",
        choices=("cpu", "gpu"),
        default=None,
        help="the e2e demo worker: cpu (default) or gpu (podsnap-demo-gpu on one nvidia.com/gpu)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = gpu_missing_reason()
    if reason is not None:
        skip_gpu = pytest.mark.skip(reason=reason)
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


ControlPlaneFactory = Callable[..., ControlPlane]


@pytest.fixture(scope="session")
def control_plane_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlaneFactory]:
    """Starts real etcd + kube-apiserver (+ kube-controller-manager) control planes; stops them at the end.

    Call it with `name` (a label for the work dir) and `controller_manager=True|False`. Suites that
    install things cluster-wide (CRDs, webhooks) take their own control plane so they cannot collide.
    """
    started: list[ControlPlane] = []

    def start(name: str = "cp", controller_manager: bool = True) -> ControlPlane:
        apiserver = require_tool("kube-apiserver")
        etcd = require_tool("etcd")
        kcm = require_tool("kube-controller-manager") if controller_manager else None
        cp = ControlPlane(tmp_path_factory.mktemp(name), apiserver, etcd, kcm)
        started.append(cp)
        return cp.start()

    yield start
    for cp in started:
        cp.stop()


@pytest.fixture(scope="session")
def control_plane(control_plane_factory: ControlPlaneFactory) -> ControlPlane:
    """One shared control plane (with controller-manager) for suites that only create namespaced objects."""
    return control_plane_factory("shared")
