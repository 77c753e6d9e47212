"""A deleted snapshot's artifact is removed even when its node is gone, or runs no agent: the operator
hands the content to the agent of another node (relabels it), which removes the artifact and then the
content's finalizer (operator/orphans.py). Real API server, operator and agent; the agent's executor is
the recording stand-in, which removes real directories."""

from __future__ import annotations

import dataclasses
import datetime
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kopf
import pytest

from podsnap import contract as c
from podsnap.kube.client import Credentials, Kube
from podsnap.operator import agent_absence, orphans
from tests.support.operator_env import (
    CLEANUP_HANDOVER_S,
    NODE,
    OTHER_NODE,
    Env,
    age_s,
    agent_pod,
    get_snap,
    podsnapshot,
    recorded_absence,
    remove_agent_pod,
    running_pod,
    set_agent_ready,
)
from tests.support.waiting import wait_for


@pytest.fixture
def agent_of_node_b(env: Env) -> Iterator[None]:
    """Node-b gets an agent pod, Ready (its kubelet says so; its agent itself never acts: it is not run); gone
    again after the test, as it is for the others."""
    agent_pod(env.cluster, OTHER_NODE)
    set_agent_ready(env.cluster, OTHER_NODE, True)
    try:
        yield
    finally:
        remove_agent_pod(env, OTHER_NODE)


def being_deleted(env: Env, name: str) -> dict[str, Any]:
    return wait_for(
        lambda: (
            (got := env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, name))
            and got["metadata"].get("deletionTimestamp")
            and got
        ),
        what="the content being deleted",
    )


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


def test_the_artifact_of_a_vanished_node_is_removed_by_a_live_agent(env: Env, ns: str) -> None:
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


def test_a_deletion_waits_from_when_the_node_last_had_a_ready_agent_never_while_it_has_one(
    env: Env, ns: str, agent_of_node_b: None
) -> None:
    log = logging.getLogger(__name__)
    name, artifact = content_with_artifact(env, ns, OTHER_NODE)
    env.cluster.kube.custom.delete_namespaced_custom_object(c.GROUP, c.VERSION, ns, c.PLURAL_POD_SNAPSHOTS, "s")
    deleted_at = being_deleted(env, name)["metadata"]["deletionTimestamp"]
    # node-b's agent is Ready: however long the deletion has waited, it stays node-b's
    wait_for(lambda: age_s(deleted_at) > CLEANUP_HANDOVER_S + 1, what="the deletion older than the wait")
    assert orphans.collect(env.operator_ctx, being_deleted(env, name), log) == orphans.Decision()

    # a blip of node-b's agent just after that: the wait starts at the blip, not at the deletion
    set_agent_ready(env.cluster, OTHER_NODE, False)
    assert orphans.collect(env.operator_ctx, being_deleted(env, name), log) == orphans.Decision()
    set_agent_ready(env.cluster, OTHER_NODE, True)
    content = being_deleted(env, name)
    assert content["metadata"]["labels"][c.LABEL_SNAPSHOT_NODE] == OTHER_NODE and artifact.exists()
    assert handed_over_events(env, name) == []

    # the agent is taken off node-b: after the wait, counted from then, node-a's agent removes the artifact
    set_agent_ready(env.cluster, OTHER_NODE, False)
    remove_agent_pod(env, OTHER_NODE)
    wait_for(
        lambda: env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, name) is None,
        what="content finalized by node-a's agent",
        timeout=CLEANUP_HANDOVER_S + 30,
    )
    assert not artifact.exists()
    event = wait_for(lambda: handed_over_events(env, name), what="an ArtifactHandedOver Event")[0]
    assert f"node {OTHER_NODE} has had no running agent" in event.message  # type: ignore[attr-defined]


def test_a_content_deleted_long_after_its_agent_went_is_handed_over_without_waiting_again(env: Env, ns: str) -> None:
    remove_agent_pod(env, OTHER_NODE)  # node-b runs no agent
    name, artifact = content_with_artifact(env, ns, OTHER_NODE)
    # the operator wrote down when it found node-b without a Ready agent (kept across its restarts: in the API)
    since = wait_for(lambda: recorded_absence(env, OTHER_NODE), what="node-b's absence recorded")
    wait_for(lambda: age_s(since) > 3 * CLEANUP_HANDOVER_S, what="node-b's agent gone for three times the wait")

    env.cluster.kube.custom.delete_namespaced_custom_object(c.GROUP, c.VERSION, ns, c.PLURAL_POD_SNAPSHOTS, "s")
    wait_for(lambda: env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, name) is None, what="content finalized")
    assert not artifact.exists()
    event = wait_for(lambda: handed_over_events(env, name), what="an ArtifactHandedOver Event")[0]
    # the wait it reports counts from the agent's absence, not from the deletion (which would say 3 s)
    waited = int(re.search(r"no running agent for (\d+) s", event.message).group(1))  # type: ignore[attr-defined,union-attr]
    assert waited >= 3 * CLEANUP_HANDOVER_S, event.message  # type: ignore[attr-defined]


def test_a_handover_from_a_stale_read_is_refused_by_the_api_server(env: Env, ns: str) -> None:
    """Two operators, or an operator and the content's own agent, acting on one content: the relabel carries
    the resourceVersion its decision was made on, so only the first write lands."""
    log = logging.getLogger(__name__)
    name, _ = content_with_artifact(env, ns, OTHER_NODE)  # node-b runs no agent: nothing else writes to it
    seen = env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, name)
    assert seen is not None
    # the content's own agent writes to it after the operator read it
    env.cluster.kube.custom.patch_cluster_custom_object(
        c.GROUP, c.VERSION, c.PLURAL_POD_SNAPSHOT_CONTENTS, name, {"metadata": {"annotations": {"test/touched": "1"}}}
    )
    with pytest.raises(kopf.TemporaryError, match="changed while being handed over"):
        orphans.hand_over(env.operator_ctx, seen, OTHER_NODE, orphans.Decision(to=NODE, why="stale"), log)
    now = env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, name)
    assert now is not None and now["metadata"]["labels"][c.LABEL_SNAPSHOT_NODE] == OTHER_NODE
    assert c.ANNOTATION_HANDED_OVER_FROM not in (now["metadata"].get("annotations") or {})

    # two operators with the same, current, read: the first write lands, the second is refused
    orphans.hand_over(env.operator_ctx, now, OTHER_NODE, orphans.Decision(to=OTHER_NODE, why="first"), log)
    with pytest.raises(kopf.TemporaryError):
        orphans.hand_over(env.operator_ctx, now, OTHER_NODE, orphans.Decision(to=NODE, why="second"), log)
    after = env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, name)
    assert after is not None and after["metadata"]["labels"][c.LABEL_SNAPSHOT_NODE] == OTHER_NODE
    assert after["metadata"]["annotations"][c.ANNOTATION_HANDED_OVER_FROM] == OTHER_NODE


def test_without_the_right_to_its_configmap_the_operator_keeps_absences_in_memory(env: Env) -> None:
    """An operator without the chart's Role (an older RBAC, a hand-made install) still ends its waits: the
    record is kept in memory, and a time once written stays, so the absence ages."""
    creds = Credentials.load(env.agent_kubeconfig)  # a ServiceAccount of the release with no ConfigMap rights
    ctx = dataclasses.replace(env.operator_ctx, credentials=creds, kube=Kube(creds.api_client()), absent_agents={})
    nobody = agent_absence.Agents()
    t0 = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)
    first = agent_absence.track(ctx, nobody, ["node-x"], t0)
    later = agent_absence.track(ctx, nobody, ["node-x"], t0 + datetime.timedelta(hours=1))
    assert first == later == {"node-x": t0} and ctx.absent_agents_in_memory
    assert recorded_absence(env, "node-x") is None, "nothing written where it had no right to"
