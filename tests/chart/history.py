"""Earlier chart versions and what an upgrade from them must keep: shared by the render-only upgrade tests
(test_upgrade.py) and the real-apiserver ones (test_reuse_values.py).

An earlier version is known by its values.yaml: with --reuse-values, the old chart's computed values
are all that an upgrade takes from it (its templates never render again). upgrade-snapshots/ holds the
values.yaml of every earlier version, comments stripped; hack/chart_docs.py reads it too.
"""

from __future__ import annotations

import copy
import json
import subprocess
from typing import Any

import yaml

from tests.chart.conftest import CHART, DOCS, REPO, SNAPSHOTS, Doc, Docs

ValuesPath = tuple[str, ...]

#: the documented leaves of values.yaml: a list or map among them is the user's whole value
ROWS: list[ValuesPath] = [key.path for key in DOCS.rows((CHART / "values.yaml").read_text())]
CURRENT: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())

#: the image registry a user sets when upgrading from a version that had no image values
REGISTRY = {"image": {"registry": "registry.example.com/podsnap"}}
#: what a user of an earlier version set, pruned per version to the keys it has (`prune`). Every kind of
#: value: a null that removes a list (tolerations), a map (agent.resources, updateStrategy) or one key
#: of a map (nodeSelector); a user map taken whole (affinity, operator.nodeSelector); a user list in
#: place of the default (accessModes); scalars. Sizes and timeouts stay unset, so an old default that
#: differs from today's is kept (`kept_old_defaults`).
USER_VALUES: dict[str, Any] = {
    "image": {"registry": "registry.example.com/podsnap"},  # podsnap publishes none: every user sets it
    "crds": {"keep": False},
    "agent": {
        "logLevel": "debug",
        "nodeSelector": {"nvidia.com/gpu.present": None, "pool": "gpu"},
        "tolerations": None,
        "resources": None,
        "updateStrategy": None,
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]
                }
            }
        },
    },
    "operator": {
        "nodeSelector": {"role": "infra"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}],
    },
    "storage": {"pvc": {"accessModes": ["ReadWriteOnce"]}},
    "webhook": {"excludeNamespaces": None},
}


def canonical(values: Any) -> str:
    return json.dumps(values, sort_keys=True)


def has_path(values: Any, path: ValuesPath) -> bool:
    for part in path:
        if not isinstance(values, dict) or part not in values:
            return False
        values = values[part]
    return True


def get_path(values: Any, path: ValuesPath) -> Any:
    for part in path:
        values = values[part]
    return values


def set_path(values: dict[str, Any], path: ValuesPath, value: Any) -> None:
    for part in path[:-1]:
        values = values.setdefault(part, {})
    values[path[-1]] = value


def prune(user: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
    """The user values an old chart accepts: only the keys its values.yaml has."""
    out: dict[str, Any] = {}
    for row in ROWS:
        if has_path(user, row) and has_path(old, row):
            set_path(out, row, get_path(user, row))
    return out


def kept_old_defaults(old: dict[str, Any], user: dict[str, Any]) -> dict[str, Any]:
    """The old chart's defaults that --reuse-values keeps, as user values for a fresh install: each value
    of the old values.yaml that differs from today's default and that the user did not set. In a map, a
    null removes what only today's default has (Helm's way).

    Keeping them is Helm's contract (the release's values are reused) and what a user needs: a claim
    must not change size, a timeout someone relied on must not change under them."""

    def with_removals(o: Any, c: Any) -> Any:
        if isinstance(o, dict) and isinstance(c, dict):
            return {
                **dict.fromkeys((k for k in c if k not in o), None),
                **{k: with_removals(v, c.get(k)) for k, v in o.items()},
            }
        return o

    out: dict[str, Any] = {}
    for row in ROWS:
        if has_path(old, row) and has_path(CURRENT, row) and not has_path(user, row):
            o, c = get_path(old, row), get_path(CURRENT, row)
            if o != c:
                set_path(out, row, with_removals(o, c))
    return out


def git(*args: str) -> str:
    proc = subprocess.run(["git", "-C", str(REPO), *args], text=True, capture_output=True, check=False)
    if proc.returncode != 0:
        raise AssertionError(
            f"git {' '.join(args)} failed: the chart's upgrade tests need the repository's history "
            f"(a full clone, not a shallow one): {proc.stderr.strip()}"
        )
    return proc.stdout


def chart_commits() -> list[tuple[str, dict[str, Any]]]:
    """(commit, values.yaml) of every commit that changed charts/podsnap, newest first."""
    out = []
    for commit in git("log", "--format=%H", "--", "charts/podsnap").split():
        out.append((commit, yaml.safe_load(git("show", f"{commit}:charts/podsnap/values.yaml")) or {}))
    return out


def stored_values() -> dict[str, dict[str, Any]]:
    return {p.stem: yaml.safe_load(p.read_text()) or {} for p in SNAPSHOTS}


def normalized(objs: dict[tuple[str, str], Doc]) -> dict[tuple[str, str], Doc]:
    """The objects with the per-install webhook certificate masked, after checking it is consistent."""
    out = copy.deepcopy(objs)
    secrets = [o for (kind, _), o in out.items() if kind == "Secret" and o.get("type") == "kubernetes.io/tls"]
    for secret in secrets:
        ca = secret["data"]["ca.crt"]
        for (kind, _), o in out.items():
            if kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
                for hook in o["webhooks"]:
                    assert hook["clientConfig"]["caBundle"] == ca, "caBundle is not the Secret's CA"
                    hook["clientConfig"]["caBundle"] = "<per-install CA>"
        secret["data"] = dict.fromkeys(secret["data"], "<per-install certificate>")
    # the pod-token key is random per install too (and kept across upgrades: tests/chart/test_security.py)
    for (kind, name), o in out.items():
        if kind == "Secret" and name.endswith("-token-key"):
            o["data"] = dict.fromkeys(o["data"], "<per-install key>")
    return out


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b), key=str):
            if key not in a:
                out.append(f"{path}.{key}: only in the fresh install: {json.dumps(b[key])[:200]}")
            elif key not in b:
                out.append(f"{path}.{key}: only after the upgrade: {json.dumps(a[key])[:200]}")
            else:
                out += differences(a[key], b[key], f"{path}.{key}")
        return out
    if a != b:
        return [f"{path}: upgrade {json.dumps(a)[:200]} != fresh {json.dumps(b)[:200]}"]
    return []


def by_name(docs: Docs) -> dict[tuple[str, str], Doc]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def pod_spec(doc: Doc) -> Doc:
    spec: Doc = doc["spec"]["template"]["spec"]
    return spec


def check_user_values_honoured(docs: Docs, user: dict[str, Any]) -> None:
    """What USER_VALUES (pruned to an old chart's keys) asks, in the rendered objects; today's default where
    the user set nothing. Catches a fill that goes wrong the same way in an upgrade and a fresh install."""

    def obj(kind: str) -> Doc:
        return next(d for d in docs if d["kind"] == kind)

    agent, operator = pod_spec(obj("DaemonSet")), pod_spec(obj("Deployment"))
    default_toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    if has_path(user, ("agent", "tolerations")):
        assert "tolerations" not in agent, "agent.tolerations=null must remove the default toleration"
    else:
        assert agent["tolerations"] == [default_toleration]
    if has_path(user, ("agent", "nodeSelector")):
        assert agent["nodeSelector"] == {"pool": "gpu"}, "one default node-selector key removed, one added"
    else:
        assert agent["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    container = agent["containers"][0]
    if has_path(user, ("agent", "resources")):
        assert "resources" not in container, "agent.resources=null must remove the default requests"
    else:
        assert container["resources"] == {"requests": {"cpu": "100m", "memory": "256Mi"}}
    strategy = obj("DaemonSet")["spec"].get("updateStrategy")
    if has_path(user, ("agent", "updateStrategy")):
        assert strategy is None, "agent.updateStrategy=null must leave the strategy to Kubernetes"
    else:
        assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
    if has_path(user, ("agent", "affinity")):
        assert agent["affinity"] == user["agent"]["affinity"]
    if has_path(user, ("operator", "tolerations")):
        assert operator["tolerations"] == user["operator"]["tolerations"]
    modes_path = ("storage", "pvc", "accessModes")
    want_modes = get_path(user, modes_path) if has_path(user, modes_path) else ["ReadWriteMany"]
    assert obj("PersistentVolumeClaim")["spec"]["accessModes"] == want_modes
    selector = obj("MutatingWebhookConfiguration")["webhooks"][0]["namespaceSelector"]["matchExpressions"]
    excluded = [v for e in selector if e["key"] == "kubernetes.io/metadata.name" for v in e.get("values", [])]
    removed = has_path(user, ("webhook", "excludeNamespaces"))
    assert ("kube-system" in excluded) is not removed, f"excluded namespaces {excluded}, user values {user}"
