"""Fixtures of the end-to-end suite: the cluster (skipped with a one-line reason when absent), podsnap
installed by Helm once per session, a namespace per test, and the flow's timings written under out/.

The suite reaches its cluster only through a kubeconfig, so the same tests run on the local cluster
of `make cluster-up`, on kind with GPUs (hack/kind/) and on any cluster a user points them at
(docs/testing.md). The cluster, chart and values come from pytest-helm-charts' options
(`--kubeconfig`, `--chart-path`, `--app-config-file-path`, `--cluster-type`; support/config.py), the
cluster connection and per-test namespaces from its fixtures (`kube_cluster`,
`namespace_factory_function_scope`, `namespace_factory`), and the rollout waits from its helpers.
podsnap keeps its own fixtures only where the plugin falls short (docs/testing.md lists why):
- `kube_config`/`kube_cluster` are overridden here with session scope (the plugin's are module-scoped,
  and podsnap is installed once per session) and without the plugin's $KUBECONFIG fallback;
- `podsnap` installs the chart with the helm CLI: the plugin installs charts only through Giant
  Swarm's App Platform or Flux, which these clusters do not run;
- `cluster` wraps the official kubernetes client next to the plugin's pykube one: the tests use its
  typed models, the API server's pod/service proxy and exec, and pykube cannot read kubeconfigs whose
  exec credential plugin speaks client.authentication.k8s.io/v1 (tests/unit/test_e2e_plugin.py);
- `--e2e-worker cpu|gpu` (tests/conftest.py) picks the demo worker: the plugin knows nothing of workloads.

Tests marked `fault(name)` (test_faults.py, test_failures.py) are counted by tests/support/fault_count.py:
the run's terminal summary says how many of the faults that ran were survived (`faults survived: N of M`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pykube
import pytest
from pytest_helm_charts.clusters import ExistingCluster
from pytest_helm_charts.k8s.daemon_set import wait_for_daemon_sets_to_run
from pytest_helm_charts.k8s.deployment import wait_for_deployments_to_run
from pytest_helm_charts.k8s.fixtures import NamespaceFactoryFunc

from tests.conftest import tool
from tests.e2e.support.config import E2EConfig
from tests.e2e.support.flow import Timings
from tests.e2e.support.images import missing_images
from tests.e2e.support.k8s import E2E_NAMESPACE_LABEL, Cluster, new_namespace, wait_until

RELEASE_LABEL = "app.kubernetes.io/instance"


@pytest.fixture(scope="session")
def e2e_config(pytestconfig: pytest.Config) -> E2EConfig:
    return E2EConfig.from_options(lambda name: pytestconfig.getoption(name, None))


def _skip_reason(cfg: E2EConfig) -> str | None:
    for name in ("kubectl", "helm"):
        if tool(name) is None:
            return f"{name} not installed: run `make setup`"
    if not cfg.kubeconfig.is_file():
        return f"no cluster: {cfg.kubeconfig} missing (run `make cluster-up`, or pass --kubeconfig)"
    return None


@pytest.fixture(scope="session")
def kube_config(e2e_config: E2EConfig) -> str:
    """Overrides pytest-helm-charts' fixture: session-scoped, and the kubeconfig of support/config.py."""
    return str(e2e_config.kubeconfig)


@pytest.fixture(scope="session")
def kube_cluster(kube_config: str, e2e_config: E2EConfig) -> Iterator[ExistingCluster]:
    """pytest-helm-charts' connection to the cluster under test (pykube), session-scoped; skips with a
    one-line reason when the cluster, its nodes or podsnap's images are missing."""
    reason = _skip_reason(e2e_config)
    if reason:
        pytest.skip(reason)
    kube = ExistingCluster(kube_config)
    client = kube.create()
    try:
        nodes = list(pykube.Node.objects(client))
    except NotImplementedError as exc:  # pykube refuses exec plugins of client.authentication.k8s.io/v1
        kube.destroy()
        pytest.skip(
            f"pytest-helm-charts' client cannot use {kube_config} ({exc}): pass a kubeconfig with a token or "
            "client certificate, or a v1beta1 exec plugin (docs/testing.md)"
        )
    except Exception as exc:  # any connection failure means: no cluster to test
        kube.destroy()
        pytest.skip(f"cluster of {kube_config} not reachable ({type(exc).__name__}): run `make cluster-up`")
    if not nodes:
        kube.destroy()
        pytest.skip(f"cluster of {kube_config} has no nodes")
    absent = missing_images(e2e_config.images, nodes)
    if absent:
        kube.destroy()
        pytest.skip(absent)
    yield kube
    kube.destroy()


@pytest.fixture(scope="session")
def cluster(kube_cluster: ExistingCluster) -> Cluster:
    """The same cluster through the official kubernetes client (typed models, proxy, exec), plus kubectl and helm."""
    assert kube_cluster.kube_config_path
    return Cluster.connect(kube_cluster.kube_config_path)


@pytest.fixture(scope="session")
def timings(e2e_config: E2EConfig) -> Iterator[Timings]:
    """Every test adds its measured steps; the whole set is written to out/e2e/timings.json."""
    t = Timings()
    yield t
    if t.values:
        e2e_config.out_dir.mkdir(parents=True, exist_ok=True)
        doc: dict[str, Any] = {
            "kubeconfig": str(e2e_config.kubeconfig),
            "cluster_type": e2e_config.cluster_type,
            "demo_image": e2e_config.demo_image,
            "gpu": e2e_config.gpu,
            "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "seconds": dict(sorted(t.values.items())),
        }
        (e2e_config.out_dir / "timings.json").write_text(json.dumps(doc, indent=2) + "\n")


@pytest.fixture(scope="session")
def podsnap(
    cluster: Cluster, kube_cluster: ExistingCluster, e2e_config: E2EConfig, timings: Timings
) -> Iterator[E2EConfig]:
    """podsnap installed the way the walkthrough does (helm upgrade --install --reuse-values), rolled out;
    uninstalled at the end, once the operator has finished the tests' namespaces (its finalizers)."""
    cfg = e2e_config
    values = [a for v in cfg.values_files for a in ("-f", str(v))]
    with timings.measure("helm_install"):
        cluster.helm(
            "upgrade", "--install", cfg.release, str(cfg.chart), "-n", cfg.release_namespace, "--create-namespace",
            "--reuse-values", *values, "--wait", "--timeout", f"{int(cfg.timeout_s)}s",
            timeout=cfg.timeout_s + 60,
        )  # fmt: skip
        # helm --wait returns once the objects are ready; the plugin's waits say so per workload
        client = kube_cluster.kube_client
        assert client is not None
        wait_for_deployments_to_run(client, [cfg.operator_deployment], cfg.release_namespace, int(cfg.timeout_s))
        wait_for_daemon_sets_to_run(client, [cfg.agent_daemonset], cfg.release_namespace, int(cfg.timeout_s))
    yield cfg
    try:
        wait_until(
            lambda: not cluster.core.list_namespace(label_selector=E2E_NAMESPACE_LABEL).items or None,
            timeout=cfg.timeout_s,
            what="the e2e namespaces to be deleted (the operator's finalizers)",
        )
    finally:
        cluster.helm("uninstall", cfg.release, "-n", cfg.release_namespace, "--wait", check=False)


@pytest.fixture
def namespace(
    cluster: Cluster, namespace_factory_function_scope: NamespaceFactoryFunc, request: pytest.FixtureRequest
) -> str:
    """A fresh namespace for one test; afterwards the plugin deletes it and waits until the operator's
    finalizers inside have finished."""
    return new_namespace(cluster, namespace_factory_function_scope, request.node.name.removeprefix("test_"))
