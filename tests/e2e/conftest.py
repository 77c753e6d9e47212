"""Fixtures of the end-to-end suite: the cluster (skipped with a one-line reason when absent), podsnap
installed by Helm once per session, a namespace per test, and the flow's timings written under out/.

The suite connects only through a kubeconfig (PODSNAP_E2E_KUBECONFIG, default: the local cluster of
`make cluster-up`), so the same tests run on the local cluster and on kind with GPUs (hack/kind/).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import tool
from tests.e2e.support.config import E2EConfig
from tests.e2e.support.flow import Timings
from tests.e2e.support.k8s import E2E_NAMESPACE_LABEL, Cluster, create_namespace, delete_namespace, wait_until

RELEASE_LABEL = "app.kubernetes.io/instance"


@pytest.fixture(scope="session")
def e2e_config() -> E2EConfig:
    return E2EConfig.from_env()


def _skip_reason(cfg: E2EConfig) -> str | None:
    for name in ("kubectl", "helm"):
        if tool(name) is None:
            return f"{name} not installed: run `make setup`"
    if not cfg.kubeconfig.is_file():
        return f"no cluster: {cfg.kubeconfig} missing (run `make cluster-up`, or set PODSNAP_E2E_KUBECONFIG)"
    return None


@pytest.fixture(scope="session")
def cluster(e2e_config: E2EConfig) -> Cluster:
    reason = _skip_reason(e2e_config)
    if reason:
        pytest.skip(reason)
    cl = Cluster.connect(e2e_config.kubeconfig)
    try:
        nodes = cl.core.list_node(_request_timeout=10).items
    except Exception as exc:  # any connection failure means: no cluster to test
        pytest.skip(f"cluster of {e2e_config.kubeconfig} not reachable ({type(exc).__name__}): run `make cluster-up`")
    if not nodes:
        pytest.skip(f"cluster of {e2e_config.kubeconfig} has no nodes")
    present = {name for n in nodes for img in (n.status.images or []) for name in (img.names or [])}
    missing = [i for i in e2e_config.images if i not in present and f"docker.io/{i}" not in present]
    if missing:
        pytest.skip(f"images {missing} on no node: run `make cluster-up` (or `make kind-up`)")
    return cl


@pytest.fixture(scope="session")
def timings(e2e_config: E2EConfig) -> Iterator[Timings]:
    """Every test adds its measured steps; the whole set is written to out/e2e/timings.json."""
    t = Timings()
    yield t
    if t.values:
        e2e_config.out_dir.mkdir(parents=True, exist_ok=True)
        doc: dict[str, Any] = {
            "kubeconfig": str(e2e_config.kubeconfig),
            "demo_image": e2e_config.demo_image,
            "gpu": e2e_config.gpu,
            "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "seconds": dict(sorted(t.values.items())),
        }
        (e2e_config.out_dir / "timings.json").write_text(json.dumps(doc, indent=2) + "\n")


@pytest.fixture(scope="session")
def podsnap(cluster: Cluster, e2e_config: E2EConfig, timings: Timings) -> Iterator[E2EConfig]:
    """podsnap installed the way the walkthrough does (helm upgrade --install --reuse-values), rolled out;
    uninstalled at the end, once the operator has finished the tests' namespaces (its finalizers)."""
    cfg = e2e_config
    missing = [str(v) for v in cfg.values_files if not v.is_file()]
    assert not missing, (
        f"chart values {missing} missing: the chart's local-cluster values must exist (PODSNAP_E2E_VALUES)"
    )
    values = [a for v in cfg.values_files for a in ("-f", str(v))]
    with timings.measure("helm_install"):
        cluster.helm(
            "upgrade", "--install", cfg.release, str(cfg.chart), "-n", cfg.release_namespace, "--create-namespace",
            "--reuse-values", *values, "--wait", "--timeout", f"{int(cfg.timeout_s)}s",
            timeout=cfg.timeout_s + 60,
        )  # fmt: skip
        for kind, name in (("deployment", cfg.operator_deployment), ("daemonset", cfg.agent_daemonset)):
            cluster.kubectl(
                "rollout", "status", f"{kind}/{name}", "-n", cfg.release_namespace, f"--timeout={int(cfg.timeout_s)}s",
                timeout=cfg.timeout_s + 30,
            )  # fmt: skip
    yield cfg
    try:
        wait_until(
            lambda: not cluster.core.list_namespace(label_selector=E2E_NAMESPACE_LABEL).items or None,
            timeout=cfg.timeout_s,
            what="the e2e namespaces to be deleted (the operator's finalizers)",
        )
    finally:
        cluster.helm("uninstall", cfg.release, "-n", cfg.release_namespace, "--wait", check=False)


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40].strip("-")


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards (the operator's finalizers clean up inside)."""
    name = create_namespace(cluster, _slug(request.node.name.removeprefix("test_"))[:30].strip("-"))
    yield name
    delete_namespace(cluster, name)
