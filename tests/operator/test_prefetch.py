"""Prefetch into the node-local artifact cache, against the real API server: a SnapshotPolicy going Ready
gets its checkpoint's PodSnapshotContent labelled `podsnap.io/prefetch`, the agent of ANOTHER node (a
second agent here, with a cache, on node-b) copies that artifact into its cache before any restore pod
exists, and the restore pod that then lands on node-b is restored from the cache. Deleting the policy
takes the label off.

The artifacts are the recording executor's (manifest.json alone, its digest the whole check: see
tests/support/recording.py); the real engine's artifacts through the cache are in tests/agent."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from podsnap import contract as c
from podsnap.agent import main as agent_main
from podsnap.agent.cache import CacheKey
from podsnap.agent.runtime import AgentContext
from tests.support.harness import KopfThread, cgroups_writable, cond_is
from tests.support.operator_env import (
    OTHER_NODE,
    Env,
    agent_kubeconfig,
    deployment,
    get_policy,
    golden,
    pod_template,
    policy,
    ready_policy,
    shaped,
)
from tests.support.recording import RecordingExecutor
from tests.support.waiting import wait_for

pytestmark = pytest.mark.skipif(cgroups_writable() is not None, reason=str(cgroups_writable()))


@pytest.fixture(scope="module")
def agent_b(env: Env, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KopfThread]:
    """node-b's agent, with a node cache and prefetch, on the same artifact volume as node-a's."""
    home = tmp_path_factory.mktemp("node-b")
    config = dataclasses.replace(
        env.agent_ctx.config,  # the same volume and token key as node-a's agent; a token bound to node-b's pod
        node_name=OTHER_NODE,
        kubeconfig=str(agent_kubeconfig(env.cluster, OTHER_NODE, env.agent_kubeconfig, home / "agent.kubeconfig")),
        cache_dir=home / "cache",
        cache_max_bytes=1 << 30,
        cache_min_free_percent=0,
        prefetch_concurrency=2,
    )
    thread = KopfThread("agent-b", agent_main.run, agent_main.build_context(config, RecordingExecutor())).start()
    try:
        yield thread
    finally:
        thread.stop()


def ctx_of(thread: KopfThread) -> AgentContext:
    assert isinstance(thread.ctx, AgentContext)
    return thread.ctx


def content_of(env: Env, ns: str, snapshot: str) -> dict[str, Any]:
    snap = env.cluster.get(c.PLURAL_POD_SNAPSHOTS, snapshot, ns)
    assert snap is not None
    content = env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, c.content_name(snap["metadata"]["uid"]))
    assert content is not None
    return content


def events_of(env: Env, name: str) -> list[Any]:
    return list(
        env.cluster.kube.core.list_namespaced_event("default", field_selector=f"involvedObject.name={name}").items
    )


def test_a_ready_policy_prefetches_its_checkpoint_into_other_nodes_caches(
    env: Env, agent_b: KopfThread, ns: str, tmp_path: Path
) -> None:
    golden(env, ns)  # captured on node-a
    content = content_of(env, ns, "golden")
    name = content["metadata"]["name"]
    assert c.LABEL_PREFETCH not in (content["metadata"].get("labels") or {}), "no policy restores from it yet"
    key = CacheKey(name, content["status"]["artifact"]["digest"])
    b = ctx_of(agent_b)
    assert b.cache is not None and not b.cache.contains(key)

    control = tmp_path / "control"
    control.mkdir()
    env.cluster.kube.apps.create_namespaced_deployment(ns, deployment("web", 0, pod_template("web", control)))
    env.cluster.create(
        c.PLURAL_SNAPSHOT_POLICIES,
        policy("pol", "Deployment", "web", checkpointRef={"name": "golden"}, deletionPolicy=c.DELETION_POLICY_RETAIN),
        ns,
    )
    ready_policy(env, ns, "pol")
    labelled = wait_for(
        lambda: (
            (o := content_of(env, ns, "golden"))["metadata"].get("labels", {}).get(c.LABEL_PREFETCH) == "true" and o
        ),
        what="the prefetch label",
    )
    assert labelled["metadata"]["annotations"][c.ANNOTATION_PREFETCH_FOR] == f"{ns}/pol"

    # node-b's agent fills its cache with no restore pod anywhere
    wait_for(lambda: b.cache is not None and b.cache.contains(key), timeout=30, what="node-b's cache filled")
    assert not env.cluster.kube.core.list_namespaced_pod(ns, label_selector=f"{c.LABEL_RESTORE}=true").items
    cached = b.cache.entries[key].artifact
    volume = env.artifact_root / labelled["spec"]["artifactPath"]
    assert (cached / "manifest.json").read_bytes() == (volume / "manifest.json").read_bytes()
    prefetched = wait_for(
        lambda: [e for e in events_of(env, name) if e.reason == c.REASON_PREFETCHED], what="a Prefetched Event"
    )
    assert OTHER_NODE in prefetched[0].message
    assert b.cache.metrics.fills.labels("filled")._value.get() >= 1  # other tests' Ready policies' too
    hits = b.cache.metrics.hits._value.get()

    # the first replica lands on node-b: restored from the node cache
    env.cluster.kube.apps.patch_namespaced_deployment("web", ns, {"spec": {"replicas": 1}})
    pod = wait_for(lambda: env.cluster.pods(ns, "app=web"), timeout=30, what="a replica")[0]
    assert shaped(pod)
    pod_name = pod["metadata"]["name"]
    env.cluster.kubelet_bind(ns, pod_name, OTHER_NODE)
    proc = env.cluster.kubelet_container({c.ENV_CONTROL_DIR: str(control), "MODEL": "tiny"})
    env.cluster.kubelet_run(ns, pod_name, ready=False, container_ids={"main": proc.container_id})
    restored = wait_for(
        lambda: (
            cond_is(p := env.cluster.pod(ns, pod_name), c.POD_CONDITION_RESTORED, reason=c.REASON_RESTORE_SUCCEEDED)
            and p
        ),
        timeout=30,
        what="restored on node-b",
    )
    condition = next(x for x in restored["status"]["conditions"] if x["type"] == c.POD_CONDITION_RESTORED)
    assert "(node cache)" in condition["message"]
    executor = b.executor
    inner = getattr(executor, "inner", None)
    assert isinstance(inner, RecordingExecutor)
    (call,) = inner.of("restore", pod_name, ns)
    assert call.request.artifact_dir == cached and call.request.verified_digests
    assert b.cache.metrics.hits._value.get() == hits + 1

    # the policy goes: so does the label (the entry stays, first in line for eviction)
    env.cluster.kube.custom.delete_namespaced_custom_object(c.GROUP, c.VERSION, ns, c.PLURAL_SNAPSHOT_POLICIES, "pol")
    wait_for(lambda: get_policy(env, ns, "pol") is None, what="policy gone")
    after = wait_for(
        lambda: c.LABEL_PREFETCH not in ((o := content_of(env, ns, "golden"))["metadata"].get("labels") or {}) and o,
        what="the prefetch label removed",
    )
    assert c.ANNOTATION_PREFETCH_FOR not in (after["metadata"].get("annotations") or {})
    wait_for(lambda: b.cache is not None and b.cache.entries[key].last_used == 0.0, what="the entry demoted")
