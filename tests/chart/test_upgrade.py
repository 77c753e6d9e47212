"""`helm upgrade --reuse-values` from earlier chart versions, with Helm's real semantics.

With --reuse-values Helm renders the NEW chart with the previous release's values IN PLACE OF the
new chart's values.yaml (pkg/action/upgrade.go: `chart.Values = oldVals`), so keys added since are
missing, not defaulted. These tests do exactly that: a copy of the chart whose values.yaml is a
snapshot of an earlier version's values, rendered with no other values. The install suite does the
same upgrade against a real API server.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from podsnap import contract
from tests.chart.conftest import CHART, FIGURES, SNAPSHOTS, Docs, container, env_of, find, render


def chart_with_values(tmp_path: Path, values: Path) -> Path:
    """The current chart with `values` as its values.yaml: what --reuse-values renders."""
    copy = tmp_path / "podsnap"
    shutil.copytree(CHART, copy)
    shutil.copy(values, copy / "values.yaml")
    return copy


def test_there_are_snapshots_of_earlier_versions() -> None:
    assert [p.stem for p in SNAPSHOTS] == ["0.1.0", "0.2.0"]
    current = yaml.safe_load((CHART / "values.yaml").read_text())
    for snap in SNAPSHOTS:
        old = yaml.safe_load(snap.read_text())
        # each snapshot lacks keys the current chart has, or it would not test anything
        assert _paths(current) - _paths(old), snap.name
    FIGURES["upgrade snapshots"] = ", ".join(p.stem for p in SNAPSHOTS)


def _paths(node: object, prefix: str = "") -> set[str]:
    if isinstance(node, dict) and node:
        return {p for k, v in node.items() for p in _paths(v, f"{prefix}.{k}" if prefix else k)}
    return {prefix}


@pytest.mark.parametrize("snapshot", SNAPSHOTS, ids=lambda p: p.stem)
@pytest.mark.parametrize("binary", ["helm3", "helm"])
def test_new_chart_renders_with_only_old_values(
    snapshot: Path, binary: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    helm: str = request.getfixturevalue(binary)
    docs = render(helm, chart=chart_with_values(tmp_path, snapshot))
    old = yaml.safe_load(snapshot.read_text())
    assert len([d for d in docs if d["kind"] == "CustomResourceDefinition"]) == 4
    for doc in docs:
        kubernetes_validate.validate(doc, "1.37.0", strict=True)
    _check_filled(docs, old)


def _check_filled(docs: Docs, old: dict[str, object]) -> None:
    # the old values are used...
    pvc = find(docs, "PersistentVolumeClaim")
    assert pvc["spec"]["resources"]["requests"]["storage"] == old["storage"]["pvc"]["size"]  # type: ignore[index]
    hook = find(docs, "MutatingWebhookConfiguration")["webhooks"][0]
    assert hook["timeoutSeconds"] == old["webhook"]["timeoutSeconds"]  # type: ignore[index]
    # ...and keys added later take the current defaults (scalars) or empty (collections)
    ds = find(docs, "DaemonSet", "podsnap-agent")
    agent = container(ds, "agent")
    env = env_of(agent)
    assert env_of(container(find(docs, "Deployment"), "operator"))[contract.ENV_SECCOMP_PROFILE] == (
        "podsnap/block-io-uring.json"
    )
    assert env[contract.ENV_HEALTH_PORT] == "8081"
    assert {p["name"]: p["containerPort"] for p in agent["ports"]}["health"] == 8081
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert volumes["seccomp-dir"]["hostPath"]["path"] == "/var/lib/kubelet/seccomp"
    assert find(docs, "ConfigMap", "podsnap-seccomp")
    crd = next(d for d in docs if d["kind"] == "CustomResourceDefinition")
    assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert "ServiceMonitor" not in [d["kind"] for d in docs]
    assert find(docs, "Secret", "podsnap-webhook-tls")
    # a new collection key fills in empty: no stray `values: null` or missing list in the webhook
    exprs = {e["key"]: e for e in hook["namespaceSelector"]["matchExpressions"]}
    assert exprs["kubernetes.io/metadata.name"]["values"][0] == "podsnap-system"


def test_values_the_user_set_to_false_survive_the_fill(helm: str, tmp_path: Path) -> None:
    values = tmp_path / "old.yaml"
    old = yaml.safe_load(SNAPSHOTS[0].read_text())
    old["crds"]["enabled"] = False
    old["webhook"]["enabled"] = False
    old["image"]["registry"] = ""
    values.write_text(yaml.safe_dump(old))
    docs = render(helm, chart=chart_with_values(tmp_path, values))
    kinds = {d["kind"] for d in docs}
    assert "CustomResourceDefinition" not in kinds and "MutatingWebhookConfiguration" not in kinds
    assert container(find(docs, "Deployment"), "operator")["image"] == "podsnap-operator:0.1.0"
