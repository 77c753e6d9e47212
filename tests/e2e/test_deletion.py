"""Step 5 of the walkthrough: deleting the example removes its capture and, with deletionPolicy
Delete, its artifact; the artifact PVC stays. With Retain the snapshot and its artifact are kept."""

from __future__ import annotations

import pytest

from podsnap import contract
from tests.e2e.support import artifacts
from tests.e2e.support.capture import run_capture
from tests.e2e.support.config import E2EConfig
from tests.e2e.support.k8s import Cluster, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
APP = "worker"


def _delete_example(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl(
        "delete", "-n", namespace, f"snapshotpolicy/{APP}", f"deployment/{APP}", f"service/{APP}", "--wait=true"
    )


def _pvcs_bound(cluster: Cluster, cfg: E2EConfig) -> bool:
    pvcs = cluster.core.list_namespaced_persistent_volume_claim(cfg.release_namespace).items
    return bool(pvcs) and all(p.status.phase == "Bound" and p.metadata.deletion_timestamp is None for p in pvcs)


def test_deleting_the_example_with_delete_removes_its_capture_and_artifact_and_keeps_the_pvc(
    cluster: Cluster, podsnap: E2EConfig, namespace: str
) -> None:
    run = run_capture(cluster, podsnap, namespace, APP, deletion=contract.DELETION_POLICY_DELETE, serve=False)
    content = artifacts.content_of(cluster, run.snapshot)
    assert artifacts.artifact_exists(cluster, podsnap, content)
    _delete_example(cluster, namespace)
    for plural in (contract.PLURAL_SNAPSHOT_JOBS, contract.PLURAL_POD_SNAPSHOTS):
        wait_until(
            lambda p=plural: not cluster.list_custom(p, namespace) or None,
            timeout=podsnap.timeout_s,
            what=f"{plural} of the example to be deleted",
        )
    wait_until(
        lambda: (
            cluster.get_custom(contract.PLURAL_POD_SNAPSHOT_CONTENTS, content["metadata"]["name"], None) is None or None
        ),
        timeout=podsnap.timeout_s,
        what=f"PodSnapshotContent {content['metadata']['name']} to be deleted",
    )
    assert not artifacts.artifact_exists(cluster, podsnap, content), "the artifact outlived deletionPolicy Delete"
    assert _pvcs_bound(cluster, podsnap), "the artifact PVC did not stay"


def test_deleting_the_example_with_retain_keeps_the_snapshot_and_its_artifact(
    cluster: Cluster, podsnap: E2EConfig, namespace: str
) -> None:
    run = run_capture(cluster, podsnap, namespace, APP, deletion=contract.DELETION_POLICY_RETAIN, serve=False)
    content = artifacts.content_of(cluster, run.snapshot)
    _delete_example(cluster, namespace)
    snapshot = cluster.get_custom(contract.PLURAL_POD_SNAPSHOTS, run.checkpoint, namespace)
    assert snapshot is not None and snapshot["metadata"].get("deletionTimestamp") is None, "Retain lost the PodSnapshot"
    assert artifacts.artifact_exists(cluster, podsnap, content), "Retain lost the artifact"
    assert _pvcs_bound(cluster, podsnap)
