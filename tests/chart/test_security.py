"""The chart's part of tenant isolation (issue 10): the validating webhook that stops podsnap's objects from
making the operator a confused deputy is on wherever the pod webhook is, fails closed, covers exactly
podsnap's namespaced objects, and is served at the operator's handler paths."""

from __future__ import annotations

import base64

from podsnap.operator.config import WEBHOOK_PATH_ID
from podsnap.operator.on_validate import VALIDATE_JOBS, VALIDATE_POLICIES, VALIDATE_SNAPSHOTS
from tests.chart.conftest import NAMESPACE, Docs, find, render

PLURALS = {"snapshotpolicies": VALIDATE_POLICIES, "snapshotjobs": VALIDATE_JOBS, "podsnapshots": VALIDATE_SNAPSHOTS}


def test_validating_webhook_fails_closed_on_podsnap_objects(default_docs: Docs, matrix: dict[str, Docs]) -> None:
    vwc = find(default_docs, "ValidatingWebhookConfiguration", "podsnap-webhook")
    hooks = {h["rules"][0]["resources"][0]: h for h in vwc["webhooks"]}
    assert set(hooks) == set(PLURALS)
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
    assert paths == {f"/podsnap/{handler}" for handler in PLURALS.values()}


def test_operator_may_ask_access_reviews_only_with_the_webhook(default_docs: Docs, matrix: dict[str, Docs]) -> None:
    def grants_sar(docs: Docs) -> bool:
        role = find(docs, "ClusterRole", "podsnap-operator")
        return any("subjectaccessreviews" in r["resources"] and r["verbs"] == ["create"] for r in role["rules"])

    assert grants_sar(default_docs)
    assert not grants_sar(matrix["minimal"])
    assert not any(
        "subjectaccessreviews" in r["resources"] for r in find(default_docs, "ClusterRole", "podsnap-agent")["rules"]
    )
