"""A deleted snapshot's artifact is removed even when its node is gone, or runs no agent: the operator
hands the content to the agent of another node (relabels it), which removes the artifact and then the
content's finalizer (operator/orphans.py). Real API server, operator and agent; the agent's executor is
the recording stand-in, which removes real directories."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from podsnap import contract as c
from podsnap.operator import orphans
from tests.support.operator_env import (
    CLEANUP_HANDOVER_S,
    NODE,
    OTHER_NODE,
    Env,
    get_snap,
    podsnapshot,
    running_pod,
    set_agent_ready,
)
from tests.support.waiting import wait_for


@pytest.fixture
def agent_ready(env: Env) -> Iterator[None]:
    """The agent of node-a is Ready (its kubelet says so); the other tests expect it not to be."""
    set_agent_ready(env.cluster, NODE, True)
    try:
        yield
    finally:
        set_agent_ready(env.cluster, NODE, False)


def content_with_artifact(env: Env, ns: str, node: str) -> tuple[str, Path]:
    """A PodSnapshot captured on `node` (its artifact and a capture's leftover staging put on the volume as
    that node's agent would have left them); returns (its content, the artifact)."""
    running_pod(env, ns, "p", node=node)
    snap = env.cluster.create(c.PLURAL_POD_SNAPSHOTS, podsnapshot("s", "p"), ns)
    name = c.content_name(snap["metadata"]["uid"])
    content = wait_for(lambda: env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, name), what="content")
    artifact = env.artifact_root / content["spec"]["artifactPath"]
    artifact.mkdir(parents=True)
    (artifact / "manifest.json").write_text("{}")
    (artifact.parent / f".{artifact.name}.staging-0123456789ab").mkdir()
    return name, artifact


def handed_over_events(env: Env, name: str) -> list[object]:
    events = env.cluster.kube.core.list_event_for_all_namespaces(field_selector=f"involvedObject.name={name}")
    return [e for e in events.items if e.reason == orphans.REASON_HANDED_OVER]


def test_the_artifact_of_a_vanished_node_is_removed_by_a_live_agent(env: Env, ns: str, agent_ready: None) -> None:
    node = "node-vanishing"
    env.cluster.kube.core.create_node({"metadata": {"name": node}})
    name, artifact = content_with_artifact(env, ns, node)
    env.cluster.kube.core.delete_node(node)
    env.cluster.kube.custom.delete_namespaced_custom_object(c.GROUP, c.VERSION, ns, c.PLURAL_POD_SNAPSHOTS, "s")

    wait_for(lambda: env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, name) is None, what="content finalized")
    wait_for(lambda: get_snap(env, ns, "s") is None, what="snapshot gone")
    assert not artifact.exists(), "the live agent removed the artifact from the shared volume"
    assert [p.name for p in artifact.parent.iterdir() if artifact.name in p.name] == [], "and its leftovers"
    assert [call.request for call in env.executor.of("remove")][-1] == artifact.resolve()
    event = wait_for(lambda: handed_over_events(env, name), what="an ArtifactHandedOver Event")[0]
    assert f"node {node} is gone" in event.message and f"node {NODE}" in event.message  # type: ignore[attr-defined]


def test_a_deletion_on_a_node_without_a_running_agent_is_handed_over_after_the_wait(
    env: Env, ns: str, agent_ready: None
) -> None:
    name, artifact = content_with_artifact(env, ns, OTHER_NODE)  # node-b exists and runs no agent
    env.cluster.kube.custom.delete_namespaced_custom_object(c.GROUP, c.VERSION, ns, c.PLURAL_POD_SNAPSHOTS, "s")
    deleting = wait_for(
        lambda: (
            (got := env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, name))
            and got["metadata"].get("deletionTimestamp")
            and got
        ),
        what="the content being deleted",
    )
    assert deleting["metadata"]["labels"][c.LABEL_SNAPSHOT_NODE] == OTHER_NODE, "first, node-b's agent may come back"
    assert artifact.exists()

    wait_for(
        lambda: env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, name) is None,
        what="content finalized by node-a's agent",
        timeout=CLEANUP_HANDOVER_S + 30,
    )
    assert not artifact.exists()
    event = wait_for(lambda: handed_over_events(env, name), what="an ArtifactHandedOver Event")[0]
    assert f"node {OTHER_NODE} has had no running agent" in event.message  # type: ignore[attr-defined]
