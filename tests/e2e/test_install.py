"""Step 1 of the walkthrough: `helm upgrade --install --reuse-values` of charts/podsnap with the
cluster's values; the operator Deployment and the agent DaemonSet roll out; the CRDs are present; the
artifact PVC is bound."""

from __future__ import annotations

import pytest

from podsnap import contract
from tests.e2e.support.config import E2EConfig
from tests.e2e.support.k8s import Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_the_operator_deployment_is_available(cluster: Cluster, podsnap: E2EConfig) -> None:
    dep = cluster.apps.read_namespaced_deployment(podsnap.operator_deployment, podsnap.release_namespace)
    assert dep.status.available_replicas and dep.status.available_replicas >= 1, dep.status


def test_the_agent_daemonset_runs_on_every_eligible_node(cluster: Cluster, podsnap: E2EConfig) -> None:
    ds = cluster.apps.read_namespaced_daemon_set(podsnap.agent_daemonset, podsnap.release_namespace)
    assert ds.status.desired_number_scheduled >= 1, "the agent is scheduled on no node: check its nodeSelector"
    assert ds.status.number_ready == ds.status.desired_number_scheduled, ds.status


def test_the_podsnap_crds_are_established(cluster: Cluster, podsnap: E2EConfig) -> None:
    for kind, (plural, _singular, short, namespaced) in contract.CRDS.items():
        crd = cluster.ext.read_custom_resource_definition(f"{plural}.{contract.GROUP}")
        established = [c for c in crd.status.conditions or [] if c.type == "Established" and c.status == "True"]
        assert established, f"CRD for {kind} not Established"
        assert crd.spec.names.kind == kind
        assert set(short) <= set(crd.spec.names.short_names or [])
        assert (crd.spec.scope == "Namespaced") == namespaced
        assert any(v.name == contract.VERSION and v.served for v in crd.spec.versions)


def test_the_artifact_pvc_is_bound(cluster: Cluster, podsnap: E2EConfig) -> None:
    pvcs = cluster.core.list_namespaced_persistent_volume_claim(podsnap.release_namespace).items
    assert pvcs, f"no PersistentVolumeClaim in {podsnap.release_namespace}: the chart's artifact PVC is missing"
    unbound = {p.metadata.name: p.status.phase for p in pvcs if p.status.phase != "Bound"}
    assert not unbound, f"artifact PVC not bound: {unbound}"
