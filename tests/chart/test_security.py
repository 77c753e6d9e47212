"""The chart's part of tenant isolation (issue 10): the validating webhook that stops podsnap's objects from
making the operator a confused deputy is on wherever the pod webhook is, fails closed, covers exactly
podsnap's namespaced objects, and is served at the operator's handler paths."""

from __future__ import annotations

import base64

from podsnap.contract import ENV_PLACEMENT, TOKEN_KEY_DIR_DEFAULT
from podsnap.operator.config import WEBHOOK_PATH_ID
from podsnap.operator.on_agent_requests import VALIDATE_AGENT_CONTENTS, VALIDATE_AGENT_NODES, VALIDATE_AGENT_PODS
from podsnap.operator.on_validate import VALIDATE_JOBS, VALIDATE_POLICIES, VALIDATE_SNAPSHOTS
from tests.chart.conftest import NAMESPACE, Docs, container, env_of, find, render

PLURALS = {"snapshotpolicies": VALIDATE_POLICIES, "snapshotjobs": VALIDATE_JOBS, "podsnapshots": VALIDATE_SNAPSHOTS}
AGENT_HOOKS = {"pods": VALIDATE_AGENT_PODS, "podsnapshotcontents": VALIDATE_AGENT_CONTENTS}
#: placement: an agent labels only its own Node (only with placement.enabled)
NODE_HOOK = {"nodes": VALIDATE_AGENT_NODES}


def test_validating_webhook_fails_closed_on_podsnap_objects(default_docs: Docs, matrix: dict[str, Docs]) -> None:
    vwc = find(default_docs, "ValidatingWebhookConfiguration", "podsnap-webhook")
    hooks = {h["rules"][0]["resources"][0]: h for h in vwc["webhooks"]}
    assert set(hooks) == set(PLURALS) | set(AGENT_HOOKS) | set(NODE_HOOK)
    ca = find(default_docs, "Secret", "podsnap-webhook-tls")["data"]["ca.crt"]
    for plural, handler in PLURALS.items():
        hook = hooks[plural]
        assert hook["failurePolicy"] == "Fail" and hook["sideEffects"] == "None"
        assert hook["rules"] == [
            {
                "apiGroups": ["podsnap.io"],
                "apiVersions": ["v1alpha1"],
                "operations": ["CREATE", "UPDATE"],
                "resources": [plural],
                "scope": "Namespaced",
            }
        ]
        # the operator serves each handler at <prefix>/<handler id>
        assert hook["clientConfig"]["service"]["path"] == f"/{handler}"
        assert base64.b64decode(hook["clientConfig"]["caBundle"]) == base64.b64decode(ca)
        # every namespace: an excluded one would be a way around the check
        assert "namespaceSelector" not in hook and "objectSelector" not in hook
    assert "ValidatingWebhookConfiguration" not in [d["kind"] for d in matrix["minimal"]]
    cm = find(matrix["cert-manager"], "ValidatingWebhookConfiguration")
    assert cm["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/podsnap-webhook"
    assert all("caBundle" not in h["clientConfig"] for h in cm["webhooks"])


def test_validating_paths_follow_the_webhook_prefix(helm: str) -> None:
    docs = render(helm, "--set", f"webhook.path=/podsnap/{WEBHOOK_PATH_ID}")
    paths = {h["clientConfig"]["service"]["path"] for h in find(docs, "ValidatingWebhookConfiguration")["webhooks"]}
    handlers = [*PLURALS.values(), *AGENT_HOOKS.values(), *NODE_HOOK.values()]
    assert paths == {f"/podsnap/{handler}" for handler in handlers}


def test_agents_use_a_token_bound_to_their_pod(matrix: dict[str, Docs]) -> None:
    """Finding 8: the agent's API token is a projected one (bound to its pod, so the webhook knows its node),
    mounted where clients look for it; Kubernetes 1.20's automounted token would name no pod."""
    for name, docs in matrix.items():
        pod = find(docs, "DaemonSet")["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False, name
        [volume] = [v for v in pod["volumes"] if v["name"] == "api-token"]
        sources = volume["projected"]["sources"]
        assert {"path": "token", "expirationSeconds": 3607} in [s.get("serviceAccountToken") for s in sources], name
        assert any((s.get("configMap") or {}).get("name") == "kube-root-ca.crt" for s in sources), name
        [agent] = [ct for ct in pod["containers"] if ct["name"] == "agent"]
        mount = {m["name"]: m for m in agent["volumeMounts"]}["api-token"]
        assert mount["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount" and mount["readOnly"], name


def test_agent_node_restriction_hooks(default_docs: Docs) -> None:
    """Finding 8: the agents' changes to pods and contents pass the operator's node check; pods fail open
    (every kubelet's status updates pass there), podsnap's own contents fail closed."""
    vwc = find(default_docs, "ValidatingWebhookConfiguration", "podsnap-webhook")
    hooks = {h["rules"][0]["resources"][0]: h for h in vwc["webhooks"]}
    assert hooks["pods"]["failurePolicy"] == "Ignore" and hooks["podsnapshotcontents"]["failurePolicy"] == "Fail"
    for plural, handler in AGENT_HOOKS.items():
        hook = hooks[plural]
        assert hook["clientConfig"]["service"]["path"] == f"/{handler}"
        [rule] = hook["rules"]
        assert rule["operations"] == ["UPDATE"] and rule["resources"] == [plural, f"{plural}/status"]
        assert "namespaceSelector" not in hook and "objectSelector" not in hook


def test_agent_node_label_hook_follows_placement(default_docs: Docs, helm: str) -> None:
    """Placement: an agent's change to a Node passes the operator's check (its own Node, its placement labels
    only). Ignore: the node controllers' updates pass there and must never wait on podsnap; the kubelet's
    status updates (nodes/status) are not sent at all. With placement off, no hook and no Node rights."""
    vwc = find(default_docs, "ValidatingWebhookConfiguration", "podsnap-webhook")
    [hook] = [h for h in vwc["webhooks"] if h["rules"][0]["resources"] == ["nodes"]]
    assert hook["failurePolicy"] == "Ignore" and hook["clientConfig"]["service"]["path"] == f"/{VALIDATE_AGENT_NODES}"
    assert hook["rules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes"], "scope": "Cluster"}
    ]
    off = render(helm, "--set", "placement.enabled=false")
    hooks = find(off, "ValidatingWebhookConfiguration")["webhooks"]
    assert not [h for h in hooks if h["rules"][0]["resources"] == ["nodes"]]
    agent_rules = find(off, "ClusterRole", "podsnap-agent")["rules"]
    assert not [r for r in agent_rules if "nodes" in r["resources"]]


def test_placement_is_off_without_the_webhook(default_docs: Docs, helm: str) -> None:
    """The webhook is what holds an agent to its own Node's placement labels, and what gives restore pods the
    affinity: with it off, no agent may patch Nodes (it could relabel any Node unchecked) and neither component
    is told placement is on, whatever placement.enabled says."""

    def node_rules(docs: Docs) -> list[dict[str, object]]:
        return [r for r in find(docs, "ClusterRole", "podsnap-agent")["rules"] if "nodes" in r["resources"]]

    def placement_env(docs: Docs) -> tuple[str, str]:
        agent = container(find(docs, "DaemonSet", "podsnap-agent"), "agent")
        operator = container(find(docs, "Deployment", "podsnap-operator"), "operator")
        return env_of(agent).get(ENV_PLACEMENT, "false"), env_of(operator).get(ENV_PLACEMENT, "false")

    assert node_rules(default_docs) == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}]
    assert placement_env(default_docs) == ("true", "true")
    off = render(helm, "--set", "webhook.enabled=false", "--set", "placement.enabled=true")
    assert not [d for d in off if d["kind"] == "ValidatingWebhookConfiguration"]
    assert node_rules(off) == []
    assert placement_env(off) == ("false", "false")


def test_operator_may_ask_access_reviews_only_with_the_webhook(default_docs: Docs, matrix: dict[str, Docs]) -> None:
    def grants_sar(docs: Docs) -> bool:
        role = find(docs, "ClusterRole", "podsnap-operator")
        return any("subjectaccessreviews" in r["resources"] and r["verbs"] == ["create"] for r in role["rules"])

    assert grants_sar(default_docs)
    assert not grants_sar(matrix["minimal"])
    assert not any(
        "subjectaccessreviews" in r["resources"] for r in find(default_docs, "ClusterRole", "podsnap-agent")["rules"]
    )


def test_token_key_is_mounted_into_the_operator_and_the_agents_only(matrix: dict[str, Docs]) -> None:
    """The key that marks podsnap's pods: a Secret the chart makes, read-only in the operator and the agent,
    never in a pod a workload could run, and never read through the API (no Secret RBAC)."""
    for name, docs in matrix.items():
        [secret] = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"].endswith("-token-key")]
        key_name = secret["metadata"]["name"]
        assert len(base64.b64decode(secret["data"]["key"])) >= 32, name
        users = {}
        for doc in docs:
            pod = (doc.get("spec") or {}).get("template", {}).get("spec")
            if not pod:
                continue
            volumes = [
                v["name"] for v in pod.get("volumes") or [] if (v.get("secret") or {}).get("secretName") == key_name
            ]
            for ct in pod["containers"] + pod.get("initContainers", []):
                for m in ct.get("volumeMounts") or []:
                    if m["name"] in volumes:
                        assert m["readOnly"] is True and m["mountPath"] == TOKEN_KEY_DIR_DEFAULT
                        users[doc["kind"]] = ct["name"]
        assert users == {"Deployment": "operator", "DaemonSet": "agent"}, name
        for role in (d for d in docs if d["kind"] in ("ClusterRole", "Role")):
            assert not any("secrets" in r.get("resources", []) for r in role["rules"]), role["metadata"]["name"]


def test_two_renders_make_two_keys(helm: str) -> None:
    """`helm template` cannot look the installed key up; an install makes a random one (an upgrade keeps it:
    tests/chart/test_install.py)."""
    keys = {find(render(helm), "Secret", "podsnap-token-key")["data"]["key"] for _ in range(2)}
    assert len(keys) == 2
