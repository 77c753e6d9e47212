"""PodSnapshot -> PodSnapshotContent -> agent, against the real API server; the test plays the kubelet."""

from __future__ import annotations

import contextlib
import statistics
import threading
import time

import pytest
from kubernetes import watch

from podsnap import contract as c
from tests.support.harness import cond_is, condition
from tests.support.operator_env import (
    NODE,
    OTHER_NODE,
    Env,
    failed_with,
    get_snap,
    no_ready_agent,
    podsnapshot,
    running_pod,
)
from tests.support.users import User, rule
from tests.support.waiting import wait_for


def test_missing_pod_fails_with_pod_not_found(env: Env, ns: str) -> None:
    env.cluster.create(c.PLURAL_POD_SNAPSHOTS, podsnapshot("s", "nope"), ns)
    snap = failed_with(env, ns, "s", c.REASON_POD_NOT_FOUND)
    assert cond_is(snap, c.COND_READY, "False", c.REASON_POD_NOT_FOUND)
    assert "boundSnapshotContentName" not in snap["status"]


def test_stale_pod_uid_fails_with_pod_uid_mismatch(env: Env, ns: str) -> None:
    running_pod(env, ns, "p")
    env.cluster.create(c.PLURAL_POD_SNAPSHOTS, podsnapshot("s", "p", uid="00000000-dead-beef-0000-000000000000"), ns)
    snap = failed_with(env, ns, "s", c.REASON_POD_UID_MISMATCH)
    assert "re-created" in condition(snap, c.COND_FAILED)["message"]  # type: ignore[index]


def test_unknown_container_fails_with_container_not_found(env: Env, ns: str) -> None:
    running_pod(env, ns, "p")
    env.cluster.create(c.PLURAL_POD_SNAPSHOTS, podsnapshot("s", "p", container="gpu"), ns)
    failed_with(env, ns, "s", c.REASON_CONTAINER_NOT_FOUND)


def test_content_is_bound_to_the_node_captured_and_cascades_on_delete(env: Env, ns: str) -> None:
    pod, proc = running_pod(env, ns, "p")
    snap = env.cluster.create(c.PLURAL_POD_SNAPSHOTS, podsnapshot("s", "p", uid=pod["metadata"]["uid"]), ns)
    uid = snap["metadata"]["uid"]
    ready = wait_for(lambda: cond_is(s := get_snap(env, ns, "s"), c.COND_READY) and s, what="snapshot Ready")
    content = env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, c.content_name(uid))
    assert content is not None and ready["status"]["boundSnapshotContentName"] == content["metadata"]["name"]
    assert content["metadata"]["labels"][c.LABEL_SNAPSHOT_NODE] == NODE
    assert c.FINALIZER_CONTENT_ARTIFACT in content["metadata"]["finalizers"]
    assert content["spec"]["nodeName"] == NODE
    assert content["spec"]["podSnapshotRef"] == {"namespace": ns, "name": "s", "uid": uid}
    assert content["spec"]["source"]["podRef"]["uid"] == pod["metadata"]["uid"]
    assert cond_is(content, c.COND_READY, reason=c.REASON_CAPTURE_COMPLETED)
    assert c.FINALIZER_SNAPSHOT in ready["metadata"]["finalizers"]
    assert ready["status"]["artifact"] == content["status"]["artifact"]
    artifact = env.artifact_root / content["spec"]["artifactPath"]
    assert (artifact / "manifest.json").exists()
    [call] = env.executor.of("capture", "p", ns)
    assert call.request.pids == (proc.pid,) and call.request.artifact_dir == artifact.resolve()

    env.cluster.kube.custom.delete_namespaced_custom_object(c.GROUP, c.VERSION, ns, c.PLURAL_POD_SNAPSHOTS, "s")
    wait_for(lambda: get_snap(env, ns, "s") is None, what="snapshot gone")
    assert env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, c.content_name(uid)) is None
    assert not artifact.exists(), "the agent's finalizer removes the artifact directory"


def test_content_of_another_node_is_left_to_that_nodes_agent(env: Env, ns: str) -> None:
    running_pod(env, ns, "p", node=OTHER_NODE)
    snap = env.cluster.create(c.PLURAL_POD_SNAPSHOTS, podsnapshot("s", "p"), ns)
    name = c.content_name(snap["metadata"]["uid"])
    content = wait_for(lambda: env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, name), what="content")
    assert content["metadata"]["labels"][c.LABEL_SNAPSHOT_NODE] == OTHER_NODE
    wait_for(lambda: cond_is(get_snap(env, ns, "s"), c.COND_READY, "False", c.REASON_PENDING), what="Pending")
    # a positive signal instead of a pause: a later content of node-a's is captured, so node-b's, which
    # came first, would have reached the agent by then had its watch not filtered it out
    running_pod(env, ns, "marker", job="m")
    env.cluster.create(c.PLURAL_POD_SNAPSHOTS, podsnapshot("m", "marker"), ns)
    wait_for(lambda: cond_is(get_snap(env, ns, "m"), c.COND_READY), what="node-a's own content captured")
    assert not env.executor.of("capture", "p", ns), "the agent of node-a must not capture node-b's content"
    assert not (env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, name) or {}).get("status", {}).get("conditions")


def test_pod_deleted_before_capture_fails_the_content_and_snapshot(env: Env, ns: str) -> None:
    """The pod is not Ready yet (the agent waits), then disappears: the agent fails with PodNotFound."""
    running_pod(env, ns, "p", ready=False)
    snap = env.cluster.create(c.PLURAL_POD_SNAPSHOTS, podsnapshot("s", "p"), ns)
    name = c.content_name(snap["metadata"]["uid"])
    wait_for(lambda: env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, name), what="content")
    env.cluster.kube.core.delete_namespaced_pod("p", ns, grace_period_seconds=0)
    failed_with(env, ns, "s", c.REASON_POD_NOT_FOUND)
    content = env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, name)
    assert cond_is(content, c.COND_FAILED, reason=c.REASON_POD_NOT_FOUND)


def test_capture_failure_is_reported_with_its_reason(env: Env, ns: str) -> None:
    from podsnap.agent.executor import ExecutionError

    env.executor.fail_capture["p"] = ExecutionError("criu dump: Can't dump", reason=c.REASON_CAPTURE_FAILED)
    try:
        running_pod(env, ns, "p")
        env.cluster.create(c.PLURAL_POD_SNAPSHOTS, podsnapshot("s", "p"), ns)
        snap = failed_with(env, ns, "s", c.REASON_CAPTURE_FAILED)
    finally:
        env.executor.fail_capture.pop("p")
    assert "Can't dump" in condition(snap, c.COND_FAILED)["message"]  # type: ignore[index]
    events = wait_for(
        lambda: [
            e for e in env.cluster.kube.core.list_namespaced_event(ns).items if e.reason == c.REASON_CAPTURE_FAILED
        ],
        what="a CaptureFailed Event",
    )
    assert events[0].type == "Warning"


def test_orphaned_content_of_a_vanished_node_is_finalized_by_the_operator(env: Env, ns: str) -> None:
    node = "node-gone"
    env.cluster.kube.core.create_node({"metadata": {"name": node}})
    running_pod(env, ns, "p", node=node)
    snap = env.cluster.create(c.PLURAL_POD_SNAPSHOTS, podsnapshot("s", "p"), ns)
    name = c.content_name(snap["metadata"]["uid"])
    wait_for(lambda: env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, name), what="content")
    env.cluster.kube.core.delete_node(node)
    with no_ready_agent(env.cluster):  # no agent could remove the artifact instead
        env.cluster.kube.custom.delete_namespaced_custom_object(c.GROUP, c.VERSION, ns, c.PLURAL_POD_SNAPSHOTS, "s")
        wait_for(lambda: env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, name) is None, what="content finalized")
    wait_for(lambda: get_snap(env, ns, "s") is None, what="snapshot gone")
    # the operator never touches the artifact volume: it says where the artifact was left
    left = wait_for(
        lambda: [
            e
            for e in env.cluster.kube.core.list_event_for_all_namespaces(
                field_selector=f"involvedObject.name={name}"
            ).items
            if e.reason == "ArtifactLeftBehind"
        ],
        what="an ArtifactLeftBehind Event on the content",
    )
    assert left[0].type == "Warning" and node in left[0].message


@pytest.mark.slow
def test_agent_pickup_latency(env: Env, ns: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Time from a PodSnapshotContent appearing in the API (seen by a watch) to the agent's capture call."""
    added: dict[str, float] = {}
    stop = threading.Event()
    w = watch.Watch()

    def watcher() -> None:
        with contextlib.suppress(Exception):  # the stream is cut when the test stops it
            _watch()

    def _watch() -> None:
        for ev in w.stream(
            env.cluster.kube.custom.list_cluster_custom_object,
            c.GROUP,
            c.VERSION,
            c.PLURAL_POD_SNAPSHOT_CONTENTS,
            timeout_seconds=60,
        ):
            if ev["type"] == "ADDED":
                added.setdefault(ev["object"]["metadata"]["name"], time.monotonic())
            if stop.is_set():
                break

    t = threading.Thread(target=watcher, daemon=True)
    t.start()
    # the watch is live once it reports a content created after it started
    running_pod(env, ns, "warm", job="warm")
    warm = env.cluster.create(c.PLURAL_POD_SNAPSHOTS, podsnapshot("warm", "warm"), ns)
    wait_for(lambda: c.content_name(warm["metadata"]["uid"]) in added, what="the test's watch to be live")
    pickups, end_to_end = [], []
    for i in range(5):
        running_pod(env, ns, f"p{i}", job=f"s{i}")
        t0 = time.monotonic()
        snap = env.cluster.create(c.PLURAL_POD_SNAPSHOTS, podsnapshot(f"s{i}", f"p{i}"), ns)
        name = c.content_name(snap["metadata"]["uid"])
        call = wait_for(lambda i=i: env.executor.of("capture", f"p{i}", ns), what="capture call")[0]
        wait_for(lambda name=name: name in added, what="watch saw the content")
        pickups.append(call.at - added[name])
        end_to_end.append(call.at - t0)
    stop.set()
    w.stop()
    with capsys.disabled():
        print(
            f"\n[pickup] PodSnapshotContent ADDED -> agent capture call: median {statistics.median(pickups) * 1000:.0f} ms, "
            f"max {max(pickups) * 1000:.0f} ms; PodSnapshot create -> capture call: median "
            f"{statistics.median(end_to_end) * 1000:.0f} ms, max {max(end_to_end) * 1000:.0f} ms (n=5)"
        )
    # a watch, not a poll, drives the agent: a handful of 100 ms pickups, one of which a loaded host may stall
    assert statistics.median(pickups) < 2.0 and max(pickups) < 15.0, pickups


def test_deleting_a_snapshot_deletes_only_its_own_content_whatever_its_status_names(env: Env, ns: str) -> None:
    """Finding 7: the attack is a namespace user who may write their PodSnapshot's status pointing
    status.boundSnapshotContentName at another namespace's content, then deleting the snapshot (the operator's
    delete handler deleted the content named there, and with it the victim's artifact)."""
    victim_ns = env.cluster.namespace(f"{ns}-victim"[:63])
    running_pod(env, victim_ns, "p")
    victim = env.cluster.create(c.PLURAL_POD_SNAPSHOTS, podsnapshot("s", "p"), victim_ns)
    victim_content = c.content_name(victim["metadata"]["uid"])
    wait_for(lambda: cond_is(get_snap(env, victim_ns, "s"), c.COND_READY), what="the victim's snapshot Ready")

    mallory = User(env.cluster, ns, "mallory")
    mallory.grant(
        rule("get create delete", "pods pods/exec"),
        rule("get list create delete patch", "podsnapshots podsnapshots/status", c.GROUP),
    )
    running_pod(env, ns, "mine", token=None)
    mallory.kube.custom.create_namespaced_custom_object(
        c.GROUP, c.VERSION, ns, c.PLURAL_POD_SNAPSHOTS, {"apiVersion": c.API_VERSION, **podsnapshot("s", "mine")}
    )
    failed_with(env, ns, "s", c.REASON_NOT_A_CAPTURE_SOURCE)  # terminal: nothing of the operator's rewrites it
    mallory.kube.custom.patch_namespaced_custom_object_status(
        c.GROUP, c.VERSION, ns, c.PLURAL_POD_SNAPSHOTS, "s", {"status": {"boundSnapshotContentName": victim_content}}
    )
    mallory.kube.custom.delete_namespaced_custom_object(c.GROUP, c.VERSION, ns, c.PLURAL_POD_SNAPSHOTS, "s")
    wait_for(lambda: get_snap(env, ns, "s") is None, what="mallory's snapshot gone")

    content = env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, victim_content)
    assert content is not None and not content["metadata"].get("deletionTimestamp"), content
    assert (env.artifact_root / content["spec"]["artifactPath"] / "manifest.json").exists()
    assert cond_is(get_snap(env, victim_ns, "s"), c.COND_READY)
