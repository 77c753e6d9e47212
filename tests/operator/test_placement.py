"""Placement (issue 12): restore pods go only to nodes that can take their artifact. The agent labels its
Node with the facts the restore gates compare; the webhook requires the artifact's recorded values of them
in the pod's node affinity, ANDed into the user's own terms; where no Ready node has them, the pod starts
cold (NoCompatibleNode) or, under restoreFailurePolicy Fail, keeps the affinity and stays Pending.
Real API server, webhook, operator and agent; the recording executor's captures record tests/support's
SOURCE facts, which node-a's agent reports as its host's."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from podsnap import contract as c
from podsnap.agent.node_labels import label_node, labelling
from podsnap.kube.placement_labels import label_value, node_labels
from podsnap.operator import stale_placement
from tests.support.harness import condition
from tests.support.operator_env import (
    ALLOCATABLE,
    CLEANUP_HANDOVER_S,
    NODE,
    OTHER_NODE,
    READY_CONDITION,
    Env,
    age_s,
    agent_pod,
    deployment,
    golden,
    pod_template,
    policy,
    ready_policy,
    recorded_absence,
    remove_agent_pod,
    set_agent_ready,
    shaped,
)
from tests.support.recording import SOURCE
from tests.support.scheduler import SCHEDULER_NAME, scheduler
from tests.support.waiting import wait_for

H200 = {"index": 0, "uuid": "GPU-0", "name": "NVIDIA H200", "memoryTotalBytes": 150 << 30, "migMode": False}
ZONE = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-a"]}
HOST = {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE, OTHER_NODE]}


def node_labels_of(env: Env, node: str) -> dict[str, str]:
    return dict(env.cluster.kube.core.read_node(node).metadata.labels or {})


def placement_labels(env: Env, node: str) -> dict[str, str]:
    return {k: v for k, v in node_labels_of(env, node).items() if k in c.NODE_FACT_LABELS}


def expected_labels(facts: Mapping[str, Any]) -> dict[str, str]:
    return {k: v for k, v in node_labels(facts).items() if v is not None}


def content_of(env: Env, ns: str, snapshot: str) -> str:
    snap = env.cluster.get(c.PLURAL_POD_SNAPSHOTS, snapshot, ns)
    assert snap is not None
    return c.content_name(snap["metadata"]["uid"])


def recorded_facts(env: Env, ns: str, **source: Any) -> None:
    """What the capture of `golden` recorded (status.source of its content), changed to `source`."""
    env.cluster.kube.custom.patch_cluster_custom_object_status(
        c.GROUP,
        c.VERSION,
        c.PLURAL_POD_SNAPSHOT_CONTENTS,
        content_of(env, ns, "golden"),
        {"status": {"source": source}},
    )


@pytest.fixture(scope="module")
def real_scheduler(env: Env, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """kube-scheduler for the pods of this module's Deployments (their schedulerName): its verdict on the
    node affinity the webhook wrote is the proof that a restore pod lands only where it can restore."""
    assert env.admin_kubeconfig is not None
    with scheduler(env.admin_kubeconfig, tmp_path_factory.mktemp("scheduler")):
        yield


def policy_pod(
    env: Env,
    ns: str,
    control: Path,
    *,
    affinity: dict[str, Any] | None = None,
    facts: Mapping[str, Any] | None = None,
    **policy_spec: Any,
) -> dict[str, Any]:
    """A Deployment (with the user's `affinity`, scheduled by the test scheduler) under a Ready SnapshotPolicy,
    its checkpoint's recorded facts changed to `facts`, scaled to one pod: the pod as the webhook let it be
    created."""
    golden(env, ns)
    if facts is not None:
        recorded_facts(env, ns, **facts)
    control.mkdir()
    template = pod_template("web", control)
    template["spec"]["schedulerName"] = SCHEDULER_NAME
    if affinity is not None:
        template["spec"]["affinity"] = copy.deepcopy(affinity)
    env.cluster.kube.apps.create_namespaced_deployment(ns, deployment("web", 0, template))
    spec = {"checkpointRef": {"name": "golden"}, **policy_spec}
    env.cluster.create(c.PLURAL_SNAPSHOT_POLICIES, policy("pol", "Deployment", "web", **spec), ns)
    ready_policy(env, ns, "pol")
    env.cluster.kube.apps.patch_namespaced_deployment("web", ns, {"spec": {"replicas": 1}})
    [pod] = wait_for(lambda: env.cluster.pods(ns, "app=web"), what="the policy's pod")
    return pod


def required_terms(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    node = ((pod["spec"].get("affinity") or {}).get("nodeAffinity")) or {}
    return list((node.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or [])


def ours(term: Mapping[str, Any]) -> dict[str, tuple[str, list[str]]]:
    return {
        e["key"]: (e["operator"], e["values"])
        for e in term.get("matchExpressions") or []
        if e["key"].startswith(c.GROUP)
    }


def scheduled_to(env: Env, ns: str, name: str) -> str:
    def node() -> str | None:
        pod = env.cluster.pod(ns, name)
        return (pod or {}).get("spec", {}).get("nodeName")

    return str(wait_for(node, what=f"the scheduler to place {name}"))


def events(env: Env, ns: str, pod: str, reason: str) -> list[Any]:
    return wait_for(
        lambda: [
            e
            for e in env.cluster.kube.core.list_namespaced_event(ns).items
            if e.reason == reason and e.involved_object.name == pod
        ],
        what=f"a {reason} Event on {pod}",
    )


def cold_pods(env: Env, reason: str) -> float:
    value = env.operator_ctx.metrics.registry.get_sample_value("podsnap_operator_cold_pods_total", {"reason": reason})
    return value or 0.0


@pytest.fixture
def node_a_facts(env: Env) -> Iterator[None]:
    """Node-a's facts may be changed by the test; they are put back (and node-a relabelled) after it."""
    original = env.agent_ctx.node_facts
    try:
        yield
    finally:
        env.agent_ctx.node_facts = original
        label_node(env.agent_ctx)


def test_the_agent_labels_its_node_with_the_facts_the_gates_compare(env: Env, node_a_facts: None) -> None:
    want = expected_labels(SOURCE)
    assert set(want) == {c.LABEL_NODE_ARCH, c.LABEL_NODE_KERNEL, c.LABEL_NODE_DRIVER}  # SOURCE has no GPUs
    # a node-b agent of an earlier test (storage, orphans, prefetch...) labelled its node, and its labels stay
    # until the operator's stale-label sweep: start node-b clean, so only node-a's agent could label it now
    env.cluster.kube.core.patch_node(OTHER_NODE, {"metadata": {"labels": dict.fromkeys(c.NODE_FACT_LABELS)}})
    wait_for(lambda: placement_labels(env, NODE) == want, what=f"node-a labelled {want}")
    assert placement_labels(env, OTHER_NODE) == {}, "node-a's agent labels only its own node"
    assert node_labels_of(env, NODE)["kubernetes.io/hostname"] == NODE  # nothing else of the Node changes

    # kept current: a label changed by hand, a GPU that appeared, a driver that went are all set right by
    # the next tick (the patch is idempotent: null removes what stopped being true)
    env.cluster.kube.core.patch_node(NODE, {"metadata": {"labels": {c.LABEL_NODE_KERNEL: "tampered"}}})
    gpu_host = {**SOURCE, "driver": "", "gpus": [H200, H200]}
    env.agent_ctx.node_facts = lambda: dict(gpu_host)
    with labelling(env.agent_ctx, interval_s=0.2):
        want = expected_labels(gpu_host)
        wait_for(lambda: placement_labels(env, NODE) == want, what=f"node-a relabelled {want}")
    assert want[c.LABEL_NODE_GPU_PRODUCT] == label_value("NVIDIA H200") and want[c.LABEL_NODE_GPU_COUNT] == "2"
    assert c.LABEL_NODE_DRIVER not in placement_labels(env, NODE)


def test_a_restore_pod_requires_the_checkpoints_facts_and_keeps_the_users_terms(
    env: Env, ns: str, tmp_path: Path, real_scheduler: None
) -> None:
    user = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [ZONE]}, {"matchExpressions": [HOST]}]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 5, "preference": {"matchExpressions": [ZONE]}}
            ],
        }
    }
    pod = policy_pod(env, ns, tmp_path / "ctl", affinity=user)
    assert shaped(pod)
    terms = required_terms(pod)
    want = {
        c.LABEL_NODE_ARCH: ("In", [SOURCE["arch"]]),
        c.LABEL_NODE_KERNEL: ("In", [SOURCE["kernel"]]),
    }  # a capture without CUDA state needs no driver or GPU
    # both of the user's terms are kept, each with its own expression and the checkpoint's facts ANDed in
    assert [t["matchExpressions"][0] for t in terms] == [ZONE, HOST]
    assert [ours(t) for t in terms] == [want, want]
    preferred = user["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert pod["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == preferred
    assert c.LABEL_PLACEMENT not in pod["metadata"]["labels"]
    # the user's second term admits both nodes, the checkpoint's facts only node-a (its agent labelled it;
    # node-b runs none): the scheduler puts it there
    assert scheduled_to(env, ns, pod["metadata"]["name"]) == NODE


def test_a_gpu_checkpoint_requires_the_driver_gpu_model_and_count(
    env: Env, ns: str, tmp_path: Path, node_a_facts: None, real_scheduler: None
) -> None:
    gpu_host = {**SOURCE, "driver": "580.159.04", "gpus": [H200, {**H200, "index": 1, "uuid": "GPU-1"}]}
    env.agent_ctx.node_facts = lambda: dict(gpu_host)
    label_node(env.agent_ctx)
    recorded = {**gpu_host, "cudaGpus": ["NVIDIA H200", "NVIDIA H200"]}
    pod = policy_pod(env, ns, tmp_path / "ctl", facts=recorded)
    assert shaped(pod)
    [term] = required_terms(pod)  # the pod had no affinity: one term, podsnap's alone
    assert ours(term) == {
        c.LABEL_NODE_ARCH: ("In", ["x86_64"]),
        c.LABEL_NODE_KERNEL: ("In", [SOURCE["kernel"]]),
        c.LABEL_NODE_DRIVER: ("In", ["580.159.04"]),
        c.LABEL_NODE_GPU_PRODUCT: ("In", [label_value("NVIDIA H200")]),
        c.LABEL_NODE_GPU_COUNT: ("Gt", ["1"]),
    }
    assert scheduled_to(env, ns, pod["metadata"]["name"]) == NODE


def test_where_no_ready_node_has_the_facts_the_pod_starts_cold_and_says_why(env: Env, ns: str, tmp_path: Path) -> None:
    before = cold_pods(env, c.REASON_NO_COMPATIBLE_NODE)
    pod = policy_pod(env, ns, tmp_path / "ctl", facts={"kernel": "6.9.0-elsewhere"})
    name = pod["metadata"]["name"]
    # left as its author wrote it: no placeholder, no affinity, its own command runs cold at once
    assert not shaped(pod) and not required_terms(pod)
    assert pod["spec"]["containers"][0]["command"] == ["python", "-m", "worker"]
    assert pod["metadata"]["labels"][c.LABEL_PLACEMENT] == c.REASON_NO_COMPATIBLE_NODE
    assert cold_pods(env, c.REASON_NO_COMPATIBLE_NODE) == before + 1

    cond = wait_for(lambda: condition(env.cluster.pod(ns, name), c.POD_CONDITION_RESTORED), what="a Restored verdict")
    assert (cond["status"], cond["reason"]) == ("False", c.REASON_FELL_BACK_TO_COLD_START), cond
    assert cond["message"].startswith(
        f"{c.REASON_NO_COMPATIBLE_NODE}: no Ready node has the checkpoint's kernel 6.9.0-elsewhere"
    ), cond
    assert f"{c.LABEL_NODE_KERNEL}=6.9.0-elsewhere" in cond["message"], cond
    [event] = events(env, ns, name, c.REASON_FELL_BACK_TO_COLD_START)
    assert event.type == "Warning"
    assert event.message.startswith(f"{c.REASON_NO_COMPATIBLE_NODE}: no Ready node has the checkpoint's kernel")


def test_under_fail_the_pod_keeps_the_affinity_and_stays_pending_saying_why(
    env: Env, ns: str, tmp_path: Path, real_scheduler: None
) -> None:
    facts = {"kernel": "6.9.0-elsewhere"}
    pod = policy_pod(env, ns, tmp_path / "ctl", facts=facts, restoreFailurePolicy=c.RESTORE_FAILURE_FAIL)
    name = pod["metadata"]["name"]
    assert shaped(pod)
    [term] = required_terms(pod)
    assert ours(term)[c.LABEL_NODE_KERNEL] == ("In", ["6.9.0-elsewhere"])
    # no node can take it: the scheduler says so, and it stays Pending (until such a node is Ready)
    [unschedulable] = events(env, ns, name, "FailedScheduling")[:1]
    assert "0/2 nodes are available" in unschedulable.message, unschedulable.message
    cond = wait_for(lambda: condition(env.cluster.pod(ns, name), c.POD_CONDITION_RESTORED), what="a Restored verdict")
    assert (cond["status"], cond["reason"]) == ("False", c.REASON_NO_COMPATIBLE_NODE), cond
    assert "kernel 6.9.0-elsewhere" in cond["message"] and "restoreFailurePolicy Fail" in cond["message"], cond
    [event] = events(env, ns, name, c.REASON_NO_COMPATIBLE_NODE)
    assert event.type == "Warning"
    assert "kernel 6.9.0-elsewhere" in event.message
    got = env.cluster.pod(ns, name)
    assert got is not None and not got["spec"].get("nodeName") and got["status"]["phase"] == "Pending"


def test_skip_compat_check_places_nothing(env: Env, ns: str, tmp_path: Path) -> None:
    """The policy skips the gates, so it skips placing by them: the pod is shaped, without podsnap's terms."""
    pod = policy_pod(env, ns, tmp_path / "ctl", facts={"kernel": "6.9.0-elsewhere"}, skipCompatCheck=True)
    assert shaped(pod) and not any(ours(t) for t in required_terms(pod))


def test_the_placement_labels_of_a_node_whose_agent_was_removed_go_after_the_wait(
    env: Env, ns: str, tmp_path: Path
) -> None:
    """A node whose agent is taken off it (the DaemonSet's nodeSelector changed) keeps no placement labels: after
    cleanup.handoverAfterSeconds without an agent the operator removes them (operator/stale_placement.py), so the
    webhook sends no restore pod there; a node whose agent pod exists, even not Ready, keeps them."""
    node = "node-c"
    facts = {**SOURCE, "kernel": "6.9.0-node-c"}  # a kernel only node-c has
    env.cluster.kube.core.create_node(
        {"metadata": {"name": node, "labels": {"kubernetes.io/hostname": node, **expected_labels(facts)}}}
    )
    try:
        env.cluster.kube.core.patch_node_status(
            node, {"status": {"conditions": [READY_CONDITION], "capacity": ALLOCATABLE, "allocatable": ALLOCATABLE}}
        )
        env.cluster.kube.core.patch_node(node, {"spec": {"taints": None}})
        agent_pod(env.cluster, node)
        set_agent_ready(env.cluster, node, False)  # crash-looping, say: it relabels its node whenever it runs
        since = wait_for(lambda: recorded_absence(env, node), what="node-c's absence recorded")
        # the operator sweeps every CLEANUP_HANDOVER_S here: two sweeps past the wait, at least one saw it due
        wait_for(lambda: age_s(since) > 3 * CLEANUP_HANDOVER_S, what="the wait and two sweeps past")
        assert placement_labels(env, node) == expected_labels(facts), "an agent pod is there: the labels stay"

        remove_agent_pod(env, node)
        wait_for(lambda: placement_labels(env, node) == {}, what="node-c's placement labels removed", timeout=30)
        assert node_labels_of(env, node) == {"kubernetes.io/hostname": node}, "and nothing else of the Node"
        assert placement_labels(env, NODE) == expected_labels(SOURCE), "node-a runs its agent: untouched"
        [event] = wait_for(
            lambda: [
                e
                for e in env.cluster.kube.core.list_namespaced_event(
                    "default", field_selector=f"involvedObject.name={node}"
                ).items
                if e.reason == stale_placement.REASON_PLACEMENT_LABELS_REMOVED
            ],
            what="a PlacementLabelsRemoved Event on node-c",
        )
        assert event.involved_object.kind == "Node" and "no podsnap agent" in event.message, event.message

        # a restore pod whose checkpoint only node-c could take is not sent there: no Ready node has its facts
        pod = policy_pod(env, ns, tmp_path / "ctl", facts={"kernel": "6.9.0-node-c"})
        assert not shaped(pod) and pod["metadata"]["labels"][c.LABEL_PLACEMENT] == c.REASON_NO_COMPATIBLE_NODE
    finally:
        remove_agent_pod(env, node)
        env.cluster.kube.core.delete_node(node)
