"""The cluster itself can run what podsnap needs: images present, in-cluster API access through the
`kubernetes` Service (what the operator and agent use), Services routing to pods, the demo worker
serving cold. None of this needs podsnap's operator; it tells a broken cluster from a broken podsnap."""

from __future__ import annotations

import pytest

from tests.e2e.support.config import E2EConfig
from tests.e2e.support.flow import (
    Timings,
    chat,
    demo_deployment,
    demo_service,
    init_id,
    pod_start_seconds,
    run_python_pod,
    wait_serving,
    worker_health,
)
from tests.e2e.support.k8s import Cluster, pod_ready

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

# in-cluster client code in a few lines: the ServiceAccount token, the cluster CA, the Service env vars
IN_CLUSTER_PROBE = """
import json, os, ssl, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
ctx = ssl.create_default_context(cafile=sa + "/ca.crt")
req = urllib.request.Request(f"https://{host}:{port}/version", headers={"Authorization": "Bearer " + open(sa + "/token").read()})
print(json.load(urllib.request.urlopen(req, context=ctx, timeout=10))["gitVersion"])
"""


def test_every_node_is_ready(cluster: Cluster) -> None:
    nodes = cluster.core.list_node().items
    not_ready = [
        n.metadata.name for n in nodes if not any(c.type == "Ready" and c.status == "True" for c in n.status.conditions)
    ]
    assert not not_ready, f"nodes not Ready: {not_ready}"


def test_a_pod_reaches_the_api_server_through_the_kubernetes_service(
    cluster: Cluster, e2e_config: E2EConfig, namespace: str
) -> None:
    phase, log = run_python_pod(cluster, e2e_config, namespace, "in-cluster-probe", script=IN_CLUSTER_PROBE)
    assert phase == "Succeeded", f"in-cluster API access failed:\n{log}"
    assert log.strip().startswith("v1."), log


def test_the_demo_worker_serves_cold_through_its_service(
    cluster: Cluster, e2e_config: E2EConfig, namespace: str, timings: Timings
) -> None:
    cluster.apply([demo_deployment(e2e_config, "cold"), demo_service(e2e_config, "cold")], namespace)
    (pod,) = wait_serving(cluster, namespace, "cold", 1, e2e_config.timeout_s)
    assert pod_ready(pod)
    health = worker_health(cluster, namespace, pod.metadata.name, e2e_config.demo_port)
    answer = chat(cluster, namespace, "cold")
    assert init_id(answer) == init_id(health), "the Service routed to another worker than the only pod"
    started = pod_start_seconds(pod)
    assert started is not None
    timings.values["cold_start_pod_ready"] = started
