"""values.schema.json rejects bad overrides with a message naming the key; templates reject values
that contradict each other; values.yaml, its schema, README table and fill defaults agree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml

from tests.chart.conftest import CHART, DOCS, FIGURES, load_hack, parallel, render_error

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())

#: (helm args, the key the error must name, a word of the reason)
BAD_OVERRIDES: list[tuple[list[str], str, str]] = [
    (["--set", "storage.pvc.size=lots"], "storage.pvc.size", "pattern"),
    (["--set", "storage.pvc.size=1TB"], "storage.pvc.size", "pattern"),
    (["--set", "operator.replcas=2"], "replcas", "not allowed"),
    (["--set", "surprise=1"], "surprise", "not allowed"),
    (["--set", "operator.replicas=2"], "operator.replicas", "1"),
    (["--set", "webhook.timeoutSeconds=60"], "webhook.timeoutSeconds", "30"),
    (["--set", "metrics.port=70000"], "metrics.port", "65535"),
    (["--set", "webhook.port=0"], "webhook.port", "1"),
    (["--set", "agent.logLevel=verbose"], "agent.logLevel", "debug"),
    (["--set", "storage.pvc.accessModes={ReadWriteSometimes}"], "storage.pvc.accessModes.0", "ReadWriteMany"),
    (["--set-string", "crds.enabled=yes"], "crds.enabled", "boolean"),
    (["--set", "operator.image.digest=sha1:abc"], "operator.image.digest", "pattern"),
    (["--set", "seccomp.profileName=/etc/profile.json"], "seccomp.profileName", "pattern"),
    (["--set", "agent.kubeletDir=var/lib/kubelet"], "agent.kubeletDir", "pattern"),
    (["--set", "webhook.path=mutate"], "webhook.path", "pattern"),
    (["--set", "webhook.path=/mutate-pod"], "webhook.path", "pattern"),
    (["--set", "image.pullPolicy=Sometimes"], "image.pullPolicy", "Always"),
    (["--set", "agent.tolerations[0].operator=Maybe"], "agent.tolerations.0.operator", "Exists"),
    (["--set", "webhook.certManager.issuerRef.kind=Vault", "--set", "webhook.certManager.issuerRef.name=x"], "webhook.certManager.issuerRef.kind", "Issuer"),
    (["--set", "metrics.serviceMonitor.interval=often"], "metrics.serviceMonitor.interval", "pattern"),
    (["--set", "storage.pvc.storageClass=Fast_SSD"], "storage.pvc.storageClass", "pattern"),
    (["--set", "commonLabels.team=has space"], "commonLabels.team", "pattern"),
    (["--set", "agent.resources.requests.memory=lots"], "agent.resources.requests.memory", ""),
    (["--set", "agent.nodeSelector.gpu=true"], "agent.nodeSelector.gpu", "string"),
]  # fmt: skip

#: values that are each valid but contradict each other: (args, words the message must contain)
CONTRADICTIONS: list[tuple[list[str], list[str]]] = [
    (["--set", "storage.pvc.existingClaim=mine"], ["storage.pvc.existingClaim", "storage.pvc.create=false"]),
    (["--set", "storage.pvc.create=false"], ["storage.pvc.create", "storage.pvc.existingClaim"]),
    (["--set", "storage.pvc.create=false", "--set", "storage.pvc.existingClaim=a", "--set", "storage.pvc.name=b"], ["storage.pvc.name"]),
    (["--set", "metrics.enabled=false", "--set", "metrics.serviceMonitor.enabled=true"], ["metrics.serviceMonitor.enabled", "metrics.enabled"]),
    (["--set", "webhook.enabled=false", "--set", "webhook.certManager.enabled=true"], ["webhook.certManager.enabled", "webhook.enabled"]),
    (["--set", "webhook.port=8080"], ["webhook.port", "metrics.port"]),
    (["--set", "agent.healthPort=8080"], ["agent.healthPort", "metrics.port"]),
    (["--set", "operator.serviceAccount.create=false"], ["operator.serviceAccount.name"]),
]  # fmt: skip


def names_key(message: str, dotted: str) -> bool:
    """Helm 3 names a key `a.b.c`, Helm 4 `/a/b/c`; an unknown key is named by itself."""
    return dotted in message or "/" + dotted.replace(".", "/") in message


@pytest.mark.parametrize("binary", ["helm3", "helm"])
def test_schema_rejects_bad_overrides_naming_the_key(binary: str, request: pytest.FixtureRequest) -> None:
    helm: str = request.getfixturevalue(binary)
    assert len(BAD_OVERRIDES) >= 12
    messages = parallel(lambda case: render_error(helm, *case[0]), BAD_OVERRIDES)
    for (args, key, reason), message in zip(BAD_OVERRIDES, messages, strict=True):
        assert "schema" in message, f"{args}: not rejected by the schema:\n{message}"
        assert names_key(message, key), f"{args}: message does not name {key}:\n{message}"
        assert reason.lower() in message.lower().replace(",", ""), (
            f"{args}: message does not say {reason!r}:\n{message}"
        )
    FIGURES["bad overrides rejected by the schema"] = f"{len(BAD_OVERRIDES)} (each with Helm 3 and Helm 4)"


@pytest.mark.parametrize("binary", ["helm3", "helm"])
def test_contradictory_values_fail_naming_both_keys(binary: str, request: pytest.FixtureRequest) -> None:
    helm: str = request.getfixturevalue(binary)
    messages = parallel(lambda case: render_error(helm, *case[0]), CONTRADICTIONS)
    for (args, words), message in zip(CONTRADICTIONS, messages, strict=True):
        for word in words:
            assert word in message, f"{args}: message lacks {word!r}:\n{message}"
    FIGURES["contradictory value sets rejected by the templates"] = str(len(CONTRADICTIONS))


def drop_nulls(node: Any) -> Any:
    """Helm deletes keys set to null before it checks the schema."""
    if isinstance(node, dict):
        return {k: drop_nulls(v) for k, v in node.items() if v is not None}
    return node


def test_defaults_and_every_scenario_are_valid_against_the_schema() -> None:
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    jsonschema.validate(VALUES, SCHEMA)
    for path in sorted((CHART / "ci").glob("*-values.yaml")):
        jsonschema.validate(drop_nulls(yaml.safe_load(path.read_text()) or {}), SCHEMA)


def leaf_paths(node: Any, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    if (
        isinstance(node, dict)
        and node
        and prefix[-1:] not in (("nodeSelector",), ("resources",), ("updateStrategy",), ("env",))
    ):
        return {p for k, v in node.items() for p in leaf_paths(v, (*prefix, k))}
    return {prefix}


def schema_at(path: tuple[str, ...]) -> dict[str, Any] | None:
    node: dict[str, Any] = SCHEMA
    for part in path:
        props = node.get("properties")
        if props is None or part not in props:
            return None
        node = props[part]
        if "$ref" in node:
            node = SCHEMA["definitions"][node["$ref"].rsplit("/", 1)[1]]
    return node


def test_schema_covers_every_value_and_nothing_else() -> None:
    rows = {key.path for key in DOCS.rows((CHART / "values.yaml").read_text())}
    for path in leaf_paths(VALUES):
        assert schema_at(path) is not None, f"values.schema.json lacks {'.'.join(path)}"

    def walk(node: dict[str, Any], prefix: tuple[str, ...]) -> None:
        if node.get("additionalProperties") is False or prefix == ():
            assert node.get("additionalProperties") is False, f"{'.'.join(prefix) or 'root'}: unknown keys allowed"
        for key, sub in (node.get("properties") or {}).items():
            path = (*prefix, key)
            if path == ("global",):
                continue
            if "$ref" in sub or sub.get("deprecated"):
                continue  # a deprecated key is accepted for upgrades from old releases, never a default
            current: Any = VALUES
            for part in path:
                assert isinstance(current, dict) and part in current, (
                    f"schema has {'.'.join(path)}, values.yaml does not"
                )
                current = current[part]
            if path not in rows and sub.get("type") == "object" and "properties" in sub:
                walk(sub, path)

    walk(SCHEMA, ())


SCHEMA_GEN = load_hack("chart_schema")


def test_kubernetes_types_of_the_schema_are_generated_from_kubernetes_openapi() -> None:
    assert SCHEMA_GEN.main(["--check"]) == 0, "run: python hack/chart_schema.py"
    k8s = {k for k in SCHEMA["definitions"] if k.startswith("io.k8s.")}
    # each value that becomes Kubernetes content refers to Kubernetes' own type
    assert schema_at(("agent", "affinity")) == SCHEMA["definitions"]["io.k8s.api.core.v1.Affinity"]
    assert schema_at(("agent", "updateStrategy")) == SCHEMA["definitions"]["io.k8s.api.apps.v1.DaemonSetUpdateStrategy"]
    assert schema_at(("operator", "resources")) == SCHEMA["definitions"]["io.k8s.api.core.v1.ResourceRequirements"]
    assert {
        "io.k8s.api.core.v1.Toleration",
        "io.k8s.api.core.v1.EnvVar",
        "io.k8s.api.core.v1.LocalObjectReference",
    } <= k8s
    assert "io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector" in k8s
    FIGURES["values schema: Kubernetes types generated"] = f"{len(k8s)} definitions (1.27 and 1.37, strict)"


def test_a_stale_kubernetes_type_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stale = json.loads((CHART / "values.schema.json").read_text())
    stale["definitions"]["io.k8s.api.core.v1.Toleration"]["properties"].pop("effect")
    path = tmp_path / "values.schema.json"
    path.write_text(json.dumps(stale))
    monkeypatch.setattr(SCHEMA_GEN, "SCHEMA", path)
    monkeypatch.setattr(SCHEMA_GEN, "REPO", tmp_path)
    assert SCHEMA_GEN.main(["--check"]) == 1
    assert SCHEMA_GEN.main([]) == 0
    assert json.loads(path.read_text()) == SCHEMA


def test_readme_table_and_fill_defaults_are_generated_from_values_yaml() -> None:
    assert DOCS.main(["--check"]) == 0, "run: python hack/chart_docs.py"


def test_every_value_is_documented_and_in_the_readme() -> None:
    text = (CHART / "values.yaml").read_text()
    assert DOCS.undocumented(text) == []
    readme = (CHART / "README.md").read_text()
    rows = DOCS.rows(text)
    assert len(rows) >= 60
    for key in rows:
        assert f"| `{'.'.join(key.path)}` |" in readme
        assert len(key.doc) > 15, f"{'.'.join(key.path)}: say what it does"


def test_docs_generator_flags_an_undocumented_key(tmp_path: Path) -> None:
    text = (CHART / "values.yaml").read_text() + "\nnewThing:\n  knob: 3\n"
    assert DOCS.undocumented(text) == ["newThing"]
