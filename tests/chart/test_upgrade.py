"""`helm upgrade --reuse-values` from earlier chart versions, rendered without a server.

With --reuse-values Helm renders the NEW chart with the previous release's computed values IN PLACE OF
the new chart's values.yaml (pkg/action/upgrade.go: `chart.Values = oldVals`): keys added since are
missing, not defaulted, and a null the user set comes back either as a null (Helm 4, and Helm 3 on
the first such upgrade) or as a missing key (Helm 3 on the next). These tests render a copy of the
chart whose values.yaml is an earlier version's computed values, and compare it with a fresh render.
test_reuse_values.py does the real upgrades against a kube-apiserver.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from podsnap import contract
from tests.chart.conftest import CHART, DOCS, FIGURES, SNAPSHOTS, container, env_of, find, render
from tests.chart.history import (
    CURRENT,
    USER_VALUES,
    by_name,
    chart_commits,
    check_user_values_honoured,
    differences,
    kept_old_defaults,
    normalized,
    prune,
    stored_values,
)


def chart_with_values(tmp_path: Path, values: dict[str, Any]) -> Path:
    """The current chart with `values` as its values.yaml: what --reuse-values renders."""
    copy_ = tmp_path / "podsnap"
    shutil.copytree(CHART, copy_)
    (copy_ / "values.yaml").write_text(yaml.safe_dump(values))
    return copy_


def key_set(node: object, prefix: tuple[str, ...] = ()) -> frozenset[tuple[str, ...]]:
    """Every path of a values tree down to its leaves (a map's keys count, a list is a leaf)."""
    if isinstance(node, dict) and node:
        return frozenset(p for k, v in node.items() for p in key_set(v, (*prefix, k)))
    return frozenset({prefix})


def test_every_earlier_values_yaml_is_stored() -> None:
    """upgrade-snapshots/ must hold the keys of every chart version: hack/chart_docs.py reads it to tell a
    key the user removed from one an older chart lacked, and the upgrade tests start from each."""
    stored = {key_set(v): name for name, v in stored_values().items()}
    commits = chart_commits()
    for commit, values in commits:
        assert key_set(values) in stored, (
            f"the values.yaml of commit {commit[:7]} is in no file of tests/chart/upgrade-snapshots/: "
            f"store it (git show {commit[:7]}:charts/podsnap/values.yaml)"
        )
    assert key_set(CURRENT) in stored, (
        "no file of tests/chart/upgrade-snapshots/ has the keys of values.yaml: store it (comments stripped) "
        "as <chart version>-<commit>.yaml, then run hack/chart_docs.py"
    )
    FIGURES["upgrade snapshots"] = f"{', '.join(sorted(stored.values()))} (covering {len(commits)} chart commits)"


@pytest.mark.parametrize("snapshot", SNAPSHOTS, ids=lambda p: p.stem)
@pytest.mark.parametrize("binary", ["helm3", "helm"])
def test_an_earlier_version_renders_what_a_fresh_install_renders(
    snapshot: Path, binary: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    helm: str = request.getfixturevalue(binary)
    old = yaml.safe_load(snapshot.read_text())
    docs = render(helm, chart=chart_with_values(tmp_path, old))
    for doc in docs:
        kubernetes_validate.validate(doc, "1.37.0", strict=True)
    check_user_values_honoured(docs, {})
    # the same objects as a fresh install, given the old defaults that --reuse-values keeps
    kept = tmp_path / "kept.yaml"
    kept.write_text(yaml.safe_dump(kept_old_defaults(old, {})))
    a, b = normalized(by_name(docs)), normalized(by_name(render(helm, "-f", str(kept))))
    assert sorted(a) == sorted(b)
    diffs = [f"{kind}/{name}{d}" for (kind, name) in sorted(a) for d in differences(a[kind, name], b[kind, name])]
    assert not diffs, "an upgrade from the old values differs from a fresh install:\n" + "\n".join(diffs)


def test_old_defaults_that_differ_are_kept_and_keys_added_later_take_their_defaults(helm: str, tmp_path: Path) -> None:
    old = stored_values()["0.1.0"]
    docs = render(helm, chart=chart_with_values(tmp_path, old))
    # the old values are used...
    pvc = find(docs, "PersistentVolumeClaim")
    assert pvc["spec"]["resources"]["requests"]["storage"] == old["storage"]["pvc"]["size"] == "50Gi"
    hook = find(docs, "MutatingWebhookConfiguration")["webhooks"][0]
    assert hook["timeoutSeconds"] == old["webhook"]["timeoutSeconds"] == 10
    assert container(find(docs, "Deployment"), "operator")["resources"] == old["operator"]["resources"]
    # ...and keys added later take today's defaults, lists and maps included
    ds = find(docs, "DaemonSet", "podsnap-agent")
    agent = container(ds, "agent")
    env = env_of(agent)
    operator_env = env_of(container(find(docs, "Deployment"), "operator"))
    assert operator_env[contract.ENV_SECCOMP_PROFILE] == "podsnap/capture-v2.json"
    assert env[contract.ENV_HEALTH_PORT] == "8081"
    assert {p["name"]: p["containerPort"] for p in agent["ports"]}["health"] == 8081
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert volumes["seccomp-dir"]["hostPath"]["path"] == "/var/lib/kubelet/seccomp"
    assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
    exprs = {e["key"]: e for e in hook["namespaceSelector"]["matchExpressions"]}
    assert exprs["kubernetes.io/metadata.name"]["values"] == ["podsnap-system", "kube-system"]
    crd = next(d for d in docs if d["kind"] == "CustomResourceDefinition")
    assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert "ServiceMonitor" not in [d["kind"] for d in docs]


def helm_coalesce(user: dict[str, Any], chart: dict[str, Any]) -> dict[str, Any]:
    """Helm's computed values: user values over the chart's, where a null deletes the chart's key."""
    out = copy.deepcopy(chart)
    for key, value in user.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = helm_coalesce(value, out[key])
        else:
            out[key] = copy.deepcopy(value)
    return out


@pytest.mark.parametrize("snapshot", SNAPSHOTS, ids=lambda p: p.stem)
@pytest.mark.parametrize("binary", ["helm3", "helm"])
def test_what_the_user_removed_with_null_stays_removed(
    snapshot: Path, binary: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Three ways a user's null reaches the chart: deleted by Helm on a fresh install, fed back as a null
    on a --reuse-values upgrade (the old computed values lack the key, the stored user values hold the
    null), or missing on Helm 3's next such upgrade. In each, what the user removed stays removed."""
    helm: str = request.getfixturevalue(binary)
    old = yaml.safe_load(snapshot.read_text())
    user = prune(USER_VALUES, old)
    user_file = tmp_path / "user.yaml"
    user_file.write_text(yaml.safe_dump(user))
    computed = helm_coalesce(user, old)
    fresh = render(helm, "-f", str(user_file))
    upgrade_null = render(helm, "-f", str(user_file), chart=chart_with_values(tmp_path / "a", computed))
    upgrade_missing = render(helm, chart=chart_with_values(tmp_path / "b", computed))
    for docs in (fresh, upgrade_null, upgrade_missing):
        check_user_values_honoured(docs, user)
        for doc in docs:
            kubernetes_validate.validate(doc, "1.37.0", strict=True)


def test_values_the_user_set_to_false_survive_the_fill(helm: str, tmp_path: Path) -> None:
    old = stored_values()["0.1.0"]
    old["crds"]["enabled"] = False
    old["webhook"]["enabled"] = False
    old["image"]["registry"] = ""
    docs = render(helm, chart=chart_with_values(tmp_path, old))
    kinds = {d["kind"] for d in docs}
    assert "CustomResourceDefinition" not in kinds and "MutatingWebhookConfiguration" not in kinds
    assert container(find(docs, "Deployment"), "operator")["image"] == "podsnap-operator:0.1.0"


VALUES_TEXT = """
# +docs:section=Test
# A scalar that every version had.
name: x
# A list every version had.
list: [a]
# A switch that came with `later`.
switch: true
# A list that came later, with `switch`.
later: [b]
"""


def test_each_removable_list_or_map_has_witnesses_from_its_version() -> None:
    history = [{"name": "x", "list": ["a"]}]
    assert DOCS.removable(VALUES_TEXT, history) == {"list": ["name"], "later": ["switch"]}
    # a list added alone: no key tells an older release's values from a user's null
    with pytest.raises(SystemExit, match="later has a non-empty default"):
        DOCS.removable(VALUES_TEXT, [{"name": "x", "list": ["a"], "switch": True}])


def test_fill_defaults_are_the_real_defaults() -> None:
    fill = DOCS.fill_values((CHART / "values.yaml").read_text())
    assert fill["agent"]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert fill["storage"]["pvc"]["accessModes"] == ["ReadWriteMany"]
    assert fill["agent"]["updateStrategy"]["type"] == "RollingUpdate"
