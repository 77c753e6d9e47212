"""Finding 3's last point (issue 10): Events of PodSnapshotContents (cluster-scoped, so published in `default`,
which many clusters let everyone read) never name the namespaces, pods or snapshots they concern; the
details stay on the content's status and on the namespaced PodSnapshot's own Events."""

from __future__ import annotations

from typing import Any

from podsnap import contract as c
from tests.support.operator_env import Env, failed_with, golden, podsnapshot, running_pod
from tests.support.waiting import wait_for


def content_events(env: Env, names: set[str]) -> list[Any]:
    return [
        e
        for e in env.cluster.kube.core.list_namespaced_event("default").items
        if e.involved_object.kind == c.KIND_POD_SNAPSHOT_CONTENT and e.involved_object.name in names
    ]


def test_content_events_in_default_name_no_namespace(env: Env, ns: str) -> None:
    golden(env, ns)  # a capture that succeeds
    running_pod(env, ns, "gone", ready=False, job="lost")  # and one whose pod goes away before it is captured
    lost = env.cluster.create(c.PLURAL_POD_SNAPSHOTS, podsnapshot("lost", "gone"), ns)
    wait_for(
        lambda: env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, c.content_name(lost["metadata"]["uid"])), what="content"
    )
    env.cluster.kube.core.delete_namespaced_pod("gone", ns, grace_period_seconds=0)
    failed_with(env, ns, "lost", c.REASON_POD_NOT_FOUND)
    golden_snap = env.cluster.get(c.PLURAL_POD_SNAPSHOTS, "golden", ns)
    assert golden_snap is not None
    names = {c.content_name(golden_snap["metadata"]["uid"]), c.content_name(lost["metadata"]["uid"])}

    wanted = {c.REASON_CAPTURE_IN_PROGRESS, c.REASON_CAPTURE_COMPLETED, c.REASON_POD_NOT_FOUND}

    def all_posted() -> list[Any]:
        got = content_events(env, names)
        return got if wanted <= {e.reason for e in got} else []

    events = wait_for(all_posted, what=f"the contents' {sorted(wanted)} Events in default")
    for e in events:
        assert ns not in (e.message or ""), f"{e.reason} in default names namespace {ns}: {e.message}"
        assert "gone" not in (e.message or "") and "golden" not in (e.message or ""), e.message
    # the details are where the namespace's users look: the PodSnapshot's own Events, in the namespace
    detailed = wait_for(
        lambda: [
            e
            for e in env.cluster.kube.core.list_namespaced_event(ns).items
            if e.reason == c.REASON_POD_NOT_FOUND and e.involved_object.name == "lost"
        ],
        what="the PodSnapshot's PodNotFound Event",
    )
    assert f"{ns}/gone" in detailed[0].message
