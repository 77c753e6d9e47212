"""Finding 8 (issue 10), agent rights: every agent shares one ServiceAccount and RBAC on 1.20 cannot narrow
it to a node, so each agent's token is bound to its own pod (as the chart mounts it) and the operator's
validating webhook refuses the agent's changes to pods and PodSnapshotContents of other nodes. Each test
uses node-a's agent's own credentials against the real API server, which calls the real webhook."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from podsnap import contract as c
from podsnap.kube.client import Credentials, Kube
from podsnap.operator.on_agent_requests import AGENT_LABELS
from tests.support.harness import RELEASE_NS
from tests.support.operator_env import AGENT_SA, NODE, OTHER_NODE, Env, agent_kubeconfig
from tests.support.users import denied
from tests.support.waiting import wait_for

FORGED = "sha256:" + "0" * 64  # a digest that would vouch for an artifact of the attacker's


def as_agent(kubeconfig: Path) -> Kube:
    return Kube(Credentials.load(kubeconfig).api_client())


def pod_on(env: Env, ns: str, name: str, node: str | None) -> None:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "db:1"}]}
    if node:
        spec["nodeName"] = node
    env.cluster.kube.core.create_namespaced_pod(ns, {"metadata": {"name": name}, "spec": spec})


def refused_for(exc: Any, node: str, what: str, where: str) -> None:
    assert exc.status == 403, exc.body
    assert f"is the podsnap agent of node {node} and may not change {what}, which belongs to {where}" in str(
        exc.body
    ), exc.body


def test_an_agent_may_not_patch_a_pod_of_another_node(env: Env, ns: str) -> None:
    """The attack: with node-a's agent token, relabel node-b's pod (into another Service) and mark it un-Ready."""
    pod_on(env, ns, "theirs", OTHER_NODE)
    pod_on(env, ns, "unscheduled", None)
    pod_on(env, ns, "mine", NODE)
    agent = as_agent(env.agent_kubeconfig)
    label = {"metadata": {"labels": {"app": "stolen"}}}
    not_ready = {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}

    refused_for(
        denied(agent.core.patch_namespaced_pod, "theirs", ns, label), NODE, f"pod {ns}/theirs", f"node {OTHER_NODE}"
    )
    exc = denied(agent.core.patch_namespaced_pod_status, "theirs", ns, not_ready)
    refused_for(exc, NODE, f"pod {ns}/theirs", f"node {OTHER_NODE}")
    exc = denied(agent.core.patch_namespaced_pod, "unscheduled", ns, label)
    refused_for(exc, NODE, f"pod {ns}/unscheduled", "no node (not scheduled)")
    assert "app" not in (env.cluster.kube.core.read_namespaced_pod("theirs", ns).metadata.labels or {})

    # its own node's pods: what it does for every restore
    agent.core.patch_namespaced_pod("mine", ns, label)
    agent.core.patch_namespaced_pod_status("mine", ns, not_ready)
    # node-b's agent, with a token bound to its own pod, may change node-b's pod
    other = as_agent(
        agent_kubeconfig(env.cluster, OTHER_NODE, env.agent_kubeconfig, env.agent_kubeconfig.parent / "b.kc")
    )
    assert other.core.patch_namespaced_pod("theirs", ns, label).metadata.labels["app"] == "stolen"


def content(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.KIND_POD_SNAPSHOT_CONTENT,
        "metadata": {"name": f"{c.CONTENT_NAME_PREFIX}{name}", "labels": {c.LABEL_SNAPSHOT_NODE: node}},
        "spec": {
            "podSnapshotRef": {"namespace": "default", "name": name, "uid": "0"},
            "source": {"podRef": {"namespace": "default", "name": name, "containers": ["main"]}},
            "nodeName": node,
            "artifactPath": f"default/{name}",
            "deletionPolicy": c.DELETION_POLICY_RETAIN,
        },
    }


def condition(kind: str, status: str, reason: str) -> dict[str, str]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": "m",
        "lastTransitionTime": "2026-12-01T00:00:00Z",
    }


def created_content(env: Env, name: str, node: str) -> str:
    body = content(name, node)
    env.cluster.create(c.PLURAL_POD_SNAPSHOT_CONTENTS, body)
    return str(body["metadata"]["name"])


def delete_content(env: Env, name: str) -> None:
    custom = env.cluster.kube.custom
    custom.patch_cluster_custom_object(
        c.GROUP, c.VERSION, c.PLURAL_POD_SNAPSHOT_CONTENTS, name, {"metadata": {"finalizers": None}}
    )
    custom.delete_cluster_custom_object(c.GROUP, c.VERSION, c.PLURAL_POD_SNAPSHOT_CONTENTS, name)
    wait_for(lambda: env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, name) is None, what=f"{name} deleted")


def test_an_agent_may_not_change_a_content_of_another_node(env: Env) -> None:
    """The attack: node-a's agent marks node-b's content Ready with an artifact path of its choosing (a
    restore on node-b would then read it), or Failed (node-b's restores stop)."""
    theirs = created_content(env, "agent-node-theirs", OTHER_NODE)
    try:
        agent = as_agent(env.agent_kubeconfig)
        custom = agent.custom
        status = {"status": {"artifact": {"digest": FORGED}}}
        exc = denied(
            custom.patch_cluster_custom_object_status,
            c.GROUP,
            c.VERSION,
            c.PLURAL_POD_SNAPSHOT_CONTENTS,
            theirs,
            status,
        )
        refused_for(exc, NODE, f"PodSnapshotContent {theirs}", f"node {OTHER_NODE}")
        spec = {"spec": {"artifactPath": "other-namespace/secret"}}
        exc = denied(
            custom.patch_cluster_custom_object, c.GROUP, c.VERSION, c.PLURAL_POD_SNAPSHOT_CONTENTS, theirs, spec
        )
        refused_for(exc, NODE, f"PodSnapshotContent {theirs}", f"node {OTHER_NODE}")
        ready = {"status": {"conditions": [condition(c.COND_READY, "True", "Captured")]}}
        exc = denied(
            custom.patch_cluster_custom_object_status, c.GROUP, c.VERSION, c.PLURAL_POD_SNAPSHOT_CONTENTS, theirs, ready
        )
        refused_for(exc, NODE, f"PodSnapshotContent {theirs}", f"node {OTHER_NODE}")
        got = env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, theirs)
        assert got is not None and got["spec"]["artifactPath"] == "default/agent-node-theirs"
        assert (got.get("status") or {}).get("artifact") is None and not (got.get("status") or {}).get("conditions")

        # what a restore on node-a that failed on node-b's artifact writes: marking it lost, and nothing more
        lost = [
            condition(c.COND_FAILED, "True", c.REASON_ARTIFACT_LOST),
            condition(c.COND_READY, "False", c.REASON_ARTIFACT_LOST),
        ]
        sneaked = {"status": {"conditions": lost, "artifact": {"digest": FORGED}}}
        exc = denied(
            custom.patch_cluster_custom_object_status,
            c.GROUP,
            c.VERSION,
            c.PLURAL_POD_SNAPSHOT_CONTENTS,
            theirs,
            sneaked,
        )
        refused_for(exc, NODE, f"PodSnapshotContent {theirs}", f"node {OTHER_NODE}")
        custom.patch_cluster_custom_object_status(
            c.GROUP, c.VERSION, c.PLURAL_POD_SNAPSHOT_CONTENTS, theirs, {"status": {"conditions": lost}}
        )
    finally:
        delete_content(env, theirs)


def test_an_agent_may_not_move_a_content_to_its_node(env: Env) -> None:
    """Relabelling node-b's content to node-a (to take it over) is refused: the node before the change counts
    too. Its own node's content it may change (what it does for every capture)."""
    theirs = created_content(env, "agent-node-move", OTHER_NODE)
    try:
        custom = as_agent(env.agent_kubeconfig).custom
        move = {"metadata": {"labels": {c.LABEL_SNAPSHOT_NODE: NODE}}}
        exc = denied(
            custom.patch_cluster_custom_object, c.GROUP, c.VERSION, c.PLURAL_POD_SNAPSHOT_CONTENTS, theirs, move
        )
        refused_for(exc, NODE, f"PodSnapshotContent {theirs}", f"node {OTHER_NODE}")
        # and the reverse: node-a's agent may not hand one of its own contents to node-b
        env.cluster.kube.custom.patch_cluster_custom_object(
            c.GROUP, c.VERSION, c.PLURAL_POD_SNAPSHOT_CONTENTS, theirs, move
        )
        away = {"metadata": {"labels": {c.LABEL_SNAPSHOT_NODE: OTHER_NODE}}}
        exc = denied(
            custom.patch_cluster_custom_object, c.GROUP, c.VERSION, c.PLURAL_POD_SNAPSHOT_CONTENTS, theirs, away
        )
        refused_for(exc, NODE, f"PodSnapshotContent {theirs}", f"node {OTHER_NODE}")
        mine = {"metadata": {"annotations": {"podsnap.io/test": "mine"}}}
        custom.patch_cluster_custom_object(c.GROUP, c.VERSION, c.PLURAL_POD_SNAPSHOT_CONTENTS, theirs, mine)
    finally:
        delete_content(env, theirs)


def test_an_agent_may_label_only_its_own_node_and_only_with_placement_labels(env: Env) -> None:
    """Placement: each agent labels its own Node with its facts (agent/node_labels.py). The attacks, with
    node-a's agent token: claim facts for node-b (restore pods would go there), set another label on its
    own Node (one that attracts other workloads), uncordon it or lift its taint."""
    agent = as_agent(env.agent_kubeconfig)
    claim = {"metadata": {"labels": {c.LABEL_NODE_KERNEL: "6.9.0-forged"}}}
    exc = denied(agent.core.patch_node, OTHER_NODE, claim)
    refused_for(exc, NODE, f"Node {OTHER_NODE}", f"node {OTHER_NODE}")
    assert c.LABEL_NODE_KERNEL not in (env.cluster.kube.core.read_node(OTHER_NODE).metadata.labels or {})

    def refused_on_own_node(change: dict[str, Any]) -> None:
        exc = denied(agent.core.patch_node, NODE, change)
        assert exc.status == 403, exc.body
        assert f"is the podsnap agent of node {NODE} and may change only its Node's placement labels" in str(
            exc.body
        ), exc.body

    refused_on_own_node({"metadata": {"labels": {"node-role.kubernetes.io/inference": "true"}}})
    refused_on_own_node({"metadata": {"labels": {"kubernetes.io/hostname": "someone-else"}}})
    refused_on_own_node({"metadata": {"annotations": {"podsnap.io/test": "x"}}})
    refused_on_own_node({"spec": {"unschedulable": True}})
    admin = env.cluster.kube.core
    admin.patch_node(NODE, {"spec": {"unschedulable": True, "taints": [{"key": "dedicated", "effect": "NoSchedule"}]}})
    try:
        refused_on_own_node({"spec": {"taints": None}})
        refused_on_own_node({"spec": {"unschedulable": False}})
    finally:
        admin.patch_node(NODE, {"spec": {"unschedulable": None, "taints": None}})
    node = admin.read_node(NODE)
    assert node.metadata.labels["kubernetes.io/hostname"] == NODE and "node-role.kubernetes.io/inference" not in (
        node.metadata.labels
    )

    # its own placement labels it may set, and remove: what it does at start and every few minutes
    own = {"metadata": {"labels": {c.LABEL_NODE_ARCH: "x86_64", c.LABEL_NODE_GPU_COUNT: None}}}
    assert agent.core.patch_node(NODE, own).metadata.labels[c.LABEL_NODE_ARCH] == "x86_64"


def test_the_operator_may_only_remove_placement_labels_of_a_node(env: Env) -> None:
    """The operator may patch Nodes (RBAC cannot narrow that to labels) for one thing: removing the placement
    labels of a node whose agent is gone (operator/stale_placement.py). The attacks, with its token: label a
    node to attract workloads, claim placement facts for it, lift a taint."""
    operator = as_agent(env.operator_kubeconfig)
    admin = env.cluster.kube.core

    def refused(change: dict[str, Any]) -> None:
        exc = denied(operator.core.patch_node, OTHER_NODE, change)
        assert exc.status == 403, exc.body
        assert "is the podsnap operator and may only remove podsnap's placement labels of a Node" in str(exc.body)

    admin.patch_node(OTHER_NODE, {"metadata": {"labels": {c.LABEL_NODE_KERNEL: "6.1.0-b"}}})
    try:
        refused({"metadata": {"labels": {"node-role.kubernetes.io/inference": "true"}}})
        refused({"metadata": {"labels": {c.LABEL_NODE_KERNEL: "6.9.0-forged"}}})
        refused({"metadata": {"labels": {c.LABEL_NODE_ARCH: "x86_64"}}})
        refused({"metadata": {"annotations": {"podsnap.io/test": "x"}}})
        refused({"spec": {"unschedulable": True}})
        labels = admin.read_node(OTHER_NODE).metadata.labels
        assert labels[c.LABEL_NODE_KERNEL] == "6.1.0-b" and "node-role.kubernetes.io/inference" not in labels

        # what it does: remove them
        got = operator.core.patch_node(OTHER_NODE, {"metadata": {"labels": {c.LABEL_NODE_KERNEL: None}}})
        assert c.LABEL_NODE_KERNEL not in got.metadata.labels
    finally:
        admin.patch_node(OTHER_NODE, {"metadata": {"labels": {c.LABEL_NODE_KERNEL: None}}})


def test_an_agent_may_not_relabel_its_own_pod_or_any_pod_of_podsnaps_namespace(env: Env, ns: str) -> None:
    """Finding 5, the attack: node-a's agent drops `app.kubernetes.io/part-of` from its own pod (no selector
    label, so its DaemonSet keeps it), after which the webhook took it for "no agent" and let everything
    through. Its own pod, and every other pod of podsnap's namespace, is refused to it."""
    agent = as_agent(env.agent_kubeconfig)
    own = f"{AGENT_SA}-{NODE}"
    for change in (
        {"metadata": {"labels": {"app.kubernetes.io/part-of": None}}},
        {"metadata": {"labels": {"app.kubernetes.io/component": "worker"}}},
        {"metadata": {"annotations": {"podsnap.io/test": "x"}}},
    ):
        exc = denied(agent.core.patch_namespaced_pod, own, RELEASE_NS, change)
        assert exc.status == 403 and "the pods of podsnap's own namespace" in str(exc.body), exc.body
    exc = denied(
        agent.core.patch_namespaced_pod_status, own, RELEASE_NS, {"status": {"conditions": [{"type": "Ready"}]}}
    )
    assert exc.status == 403, exc.body
    labels = env.cluster.kube.core.read_namespaced_pod(own, RELEASE_NS).metadata.labels
    assert all(labels.get(k) == v for k, v in AGENT_LABELS.items()), labels


def test_an_agent_whose_pod_lost_its_labels_is_still_held_to_its_node(env: Env, ns: str) -> None:
    """Finding 5: what the relabelling would have reached, done by the admin: node-a's agent pod without any
    agent label. Its requests are still its (told by its ServiceAccount and bound pod): node-b's pod, node-b's
    Node and a content of node-b stay refused. The same ServiceAccount's token bound to no pod (the legacy
    Secret token of 1.20) may change none of them either."""
    pod_on(env, ns, "theirs", OTHER_NODE)
    admin, own = env.cluster.kube.core, f"{AGENT_SA}-{NODE}"
    label = {"metadata": {"labels": {"app": "stolen"}}}
    agent = as_agent(env.agent_kubeconfig)
    admin.patch_namespaced_pod(own, RELEASE_NS, {"metadata": {"labels": dict.fromkeys(AGENT_LABELS)}})
    theirs = created_content(env, "agent-node-unlabelled", OTHER_NODE)
    try:
        exc = denied(agent.core.patch_namespaced_pod, "theirs", ns, label)
        refused_for(exc, NODE, f"pod {ns}/theirs", f"node {OTHER_NODE}")
        exc = denied(agent.core.patch_node, OTHER_NODE, {"metadata": {"labels": {c.LABEL_NODE_KERNEL: "x"}}})
        refused_for(exc, NODE, f"Node {OTHER_NODE}", f"node {OTHER_NODE}")
        exc = denied(
            agent.custom.patch_cluster_custom_object,
            c.GROUP,
            c.VERSION,
            c.PLURAL_POD_SNAPSHOT_CONTENTS,
            theirs,
            {"spec": {"artifactPath": "other-namespace/secret"}},
        )
        refused_for(exc, NODE, f"PodSnapshotContent {theirs}", f"node {OTHER_NODE}")
    finally:
        admin.patch_namespaced_pod(own, RELEASE_NS, {"metadata": {"labels": dict(AGENT_LABELS)}})
        delete_content(env, theirs)

    legacy = as_agent(env.agent_kubeconfig.parent / "legacy.kubeconfig")
    exc = denied(legacy.core.patch_namespaced_pod, "theirs", ns, label)
    assert exc.status == 403 and "is not bound to a pod" in str(exc.body), exc.body
    assert "app" not in (admin.read_namespaced_pod("theirs", ns).metadata.labels or {})
