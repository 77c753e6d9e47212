"""The agent's node-local artifact cache on the local cluster: once the SnapshotPolicy is Ready its
checkpoint's PodSnapshotContent is labelled for prefetch, the node's agent copies the artifact into its
cache (a `Prefetched` Event on the content), and a replica scaled up afterwards is restored from that
copy (its Restored condition says "node cache") and answers with the capture source's init id.

A cache entry that is changed on the node afterwards is never restored: the next replica is restored
from the volume, and still answers as the source."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from podsnap import contract
from tests.e2e.support.artifacts import agent_pod, content_of
from tests.e2e.support.capture import CaptureRun, run_capture
from tests.e2e.support.config import E2EConfig
from tests.e2e.support.flow import init_id, wait_serving, worker_health
from tests.e2e.support.k8s import Cluster, Pending, create_namespace, delete_namespace, pod_condition, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
APP = "cached"
CACHE = f"${{{contract.ENV_CACHE_DIR}:-{contract.CACHE_DIR_IN_AGENT}}}"


@pytest.fixture(scope="module")
def run(cluster: Cluster, podsnap: E2EConfig) -> Iterator[CaptureRun]:
    ns = create_namespace(cluster, "cache")
    try:
        yield run_capture(cluster, podsnap, ns, APP, startup=contract.STARTUP_POLICY_WAIT)
    finally:
        delete_namespace(cluster, ns)


def in_agent(cluster: Cluster, cfg: E2EConfig, node: str, script: str) -> str:
    pod = agent_pod(cluster, cfg, node)
    sh = f'CACHE="{CACHE}" exec python3 -c "$0"'
    return str(cluster.kubectl("exec", "-n", cfg.release_namespace, pod, "--", "sh", "-c", sh, script).stdout).strip()


def prefetched(cluster: Cluster, content: dict[str, Any]) -> list[Any]:
    name = content["metadata"]["name"]
    events = cluster.core.list_namespaced_event("default", field_selector=f"involvedObject.name={name}").items
    return [e for e in events if e.reason == contract.REASON_PREFETCHED]


def test_a_ready_policys_checkpoint_is_prefetched_into_the_node_cache(
    cluster: Cluster, run: CaptureRun, podsnap: E2EConfig
) -> None:
    content = content_of(cluster, run.snapshot)
    labels = content["metadata"].get("labels") or {}
    assert labels.get(contract.LABEL_PREFETCH) == "true", labels
    got = wait_until(
        lambda: prefetched(cluster, content) or Pending("no Prefetched Event yet"),
        timeout=podsnap.timeout_s,
        what="the Prefetched Event",
    )
    assert content["spec"]["nodeName"] in got[0].message
    listing = in_agent(
        cluster,
        podsnap,
        content["spec"]["nodeName"],
        "import os; print(sorted(os.listdir(os.environ['CACHE'] + '/entries')))",
    )
    assert content["metadata"]["name"] in listing, listing


def test_a_replica_after_the_prefetch_is_restored_from_the_node_cache(
    cluster: Cluster, run: CaptureRun, podsnap: E2EConfig
) -> None:
    content = content_of(cluster, run.snapshot)
    wait_until(
        lambda: prefetched(cluster, content) or Pending("not prefetched"), timeout=podsnap.timeout_s, what="prefetch"
    )
    before = {p.metadata.name for p in run.require_serving()}
    cluster.apps.patch_namespaced_deployment_scale(APP, run.namespace, {"spec": {"replicas": len(before) + 1}})
    pods = wait_serving(cluster, run.namespace, APP, len(before) + 1, podsnap.timeout_s)
    (new,) = [p for p in pods if p.metadata.name not in before]
    cond = pod_condition(new, contract.POD_CONDITION_RESTORED)
    assert cond is not None and cond.reason == contract.REASON_RESTORE_SUCCEEDED, cond
    assert "(node cache)" in (cond.message or ""), cond.message
    health = worker_health(cluster, run.namespace, new.metadata.name, podsnap.demo_port)
    assert init_id(health) in run.source_init_ids


TAMPER = """
import os
root = os.environ["CACHE"] + "/entries"
(entry,) = [e for e in os.listdir(root) if e.startswith(os.environ["CONTENT"] + "@")]
art = os.path.join(root, entry, "artifact")
files = [os.path.join(d, f) for d, _, fs in os.walk(art) for f in fs if f != "manifest.json"]
victim = max(files, key=os.path.getsize)
with open(victim, "r+b") as f:
    f.seek(os.path.getsize(victim) // 2)
    data = f.read(64)
    f.seek(os.path.getsize(victim) // 2)
    f.write(bytes(b ^ 0xFF for b in data))
print(victim)
"""


def test_a_changed_cache_entry_is_never_restored(cluster: Cluster, run: CaptureRun, podsnap: E2EConfig) -> None:
    content = content_of(cluster, run.snapshot)
    node = content["spec"]["nodeName"]
    wait_until(
        lambda: prefetched(cluster, content) or Pending("not prefetched"), timeout=podsnap.timeout_s, what="prefetch"
    )
    victim = in_agent(
        cluster, podsnap, node, f"import os; os.environ['CONTENT'] = {content['metadata']['name']!r}\n" + TAMPER
    )
    assert victim
    before = {p.metadata.name for p in wait_serving(cluster, run.namespace, APP, 1, podsnap.timeout_s)}
    count = len(before) + 1
    cluster.apps.patch_namespaced_deployment_scale(APP, run.namespace, {"spec": {"replicas": count}})
    pods = wait_serving(cluster, run.namespace, APP, count, podsnap.timeout_s)
    (new,) = [p for p in pods if p.metadata.name not in before]
    cond = pod_condition(new, contract.POD_CONDITION_RESTORED)
    assert cond is not None and cond.reason == contract.REASON_RESTORE_SUCCEEDED, cond
    assert "(node cache)" not in (cond.message or ""), "restored from the changed copy"
    health = worker_health(cluster, run.namespace, new.metadata.name, podsnap.demo_port)
    assert init_id(health) in run.source_init_ids
