"""`startupPolicy: Immediate`: the workload serves cold while the capture runs; pods created after the
checkpoint is Ready restore from it."""

from __future__ import annotations

import pytest

from podsnap import contract
from tests.e2e.support.capture import restored_summary, run_capture
from tests.e2e.support.config import E2EConfig
from tests.e2e.support.flow import Timings, init_id, restore_from, restored, wait_serving, worker_health
from tests.e2e.support.k8s import Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
APP = "worker"


def test_immediate_serves_cold_while_capturing_and_restores_pods_created_after_ready(
    cluster: Cluster, podsnap: E2EConfig, namespace: str, timings: Timings
) -> None:
    run = run_capture(cluster, podsnap, namespace, APP, startup=contract.STARTUP_POLICY_IMMEDIATE)
    timings.values.update({f"immediate_{k}": v for k, v in run.seconds.items()})
    (first,) = run.require_serving()
    assert restore_from(first) is None and restored(first) is None, (
        f"the first pod should have started cold: {restored_summary(run.serving)}"
    )
    cold_id = init_id(worker_health(cluster, namespace, first.metadata.name, podsnap.demo_port))
    assert cold_id not in run.source_init_ids, "the cold pod and the capture source share an init id"

    cluster.apps.patch_namespaced_deployment_scale(APP, namespace, {"spec": {"replicas": 2}})
    pods = wait_serving(cluster, namespace, APP, 2, podsnap.timeout_s)
    (new,) = [p for p in pods if p.metadata.name != first.metadata.name]
    assert restored(new) == f"True/{contract.REASON_RESTORE_SUCCEEDED}", restored_summary(pods)
    assert restore_from(new) == run.checkpoint
    assert init_id(worker_health(cluster, namespace, new.metadata.name, podsnap.demo_port)) in run.source_init_ids
    # placement: the node's agent labelled it with its host's facts, and the restore pod required the
    # checkpoint's values of them (docs/troubleshooting.md, Placement)
    labels = cluster.core.read_node(new.spec.node_name).metadata.labels or {}
    terms = new.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms
    required = {e.key: e.values for t in terms for e in t.match_expressions or [] if e.key in contract.NODE_FACT_LABELS}
    assert set(required) >= {contract.LABEL_NODE_ARCH, contract.LABEL_NODE_KERNEL}, required
    assert all(labels.get(key) in values for key, values in required.items()), (required, labels)
