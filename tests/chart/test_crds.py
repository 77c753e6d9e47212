"""The chart's CRDs: generated from hack/chart_crds.py, in step with podsnap.contract."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from podsnap import contract

REPO = Path(__file__).resolve().parents[2]


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chart_crds", REPO / "hack" / "chart_crds.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["chart_crds"] = module
    spec.loader.exec_module(module)
    return module


GEN = load_generator()


@pytest.mark.parametrize("kind", sorted(contract.CRDS))
def test_chart_crd_template_is_what_the_generator_writes(kind: str) -> None:
    path = GEN.template_path(kind)
    assert path.exists(), f"{path} missing: run python hack/chart_crds.py"
    assert path.read_text() == GEN.render(kind), f"{path.name} is stale: run python hack/chart_crds.py"


def test_no_stray_crd_templates() -> None:
    expected = {GEN.template_path(kind).name for kind in contract.CRDS}
    found = {p.name for p in (REPO / "charts" / "podsnap" / "templates").glob("crd-*.yaml")}
    assert found == expected


@pytest.mark.parametrize("kind", sorted(contract.CRDS))
def test_crd_names_and_scope_match_the_contract(kind: str) -> None:
    plural, singular, short, namespaced = contract.CRDS[kind]
    crd: dict[str, Any] = GEN.crd(kind)
    names = crd["spec"]["names"]
    assert crd["metadata"]["name"] == f"{plural}.{contract.GROUP}"
    assert crd["spec"]["group"] == contract.GROUP
    assert (names["kind"], names["plural"], names["singular"]) == (kind, plural, singular)
    assert tuple(names["shortNames"]) == short
    assert crd["spec"]["scope"] == ("Namespaced" if namespaced else "Cluster")
    (version,) = crd["spec"]["versions"]
    assert version["name"] == contract.VERSION and version["storage"] and version["served"]
    assert version["subresources"] == {"status": {}}
    schema = version["schema"]["openAPIV3Schema"]
    assert schema["required"] == ["spec"]
    assert schema["properties"]["spec"]["x-kubernetes-validations"] == [
        {"rule": "self == oldSelf", "message": "spec is immutable"}
    ]
    conditions = schema["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert set(conditions["items"]["required"]) == {"lastTransitionTime", "message", "reason", "status", "type"}


def spec_of(kind: str) -> dict[str, Any]:
    schema: dict[str, Any] = GEN.crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema["properties"]["spec"]


def test_defaults_and_enums_from_the_design() -> None:
    job = spec_of(contract.KIND_SNAPSHOT_JOB)["properties"]
    assert job["activeDeadlineSeconds"]["default"] == 3600
    assert job["podTemplate"]["x-kubernetes-preserve-unknown-fields"] is True
    targets = job["podSnapshotTemplate"]["properties"]["targetContainers"]
    assert (targets["default"], targets["minItems"], targets["maxItems"]) == (["main"], 1, 1)
    policy = spec_of(contract.KIND_SNAPSHOT_POLICY)["properties"]
    assert policy["startupPolicy"]["enum"] == ["Immediate", "WaitForCheckpoint"]
    assert policy["startupPolicy"]["default"] == "Immediate"
    assert policy["deletionPolicy"]["enum"] == ["Delete", "Retain"]
    assert policy["deletionPolicy"]["default"] == "Delete"
    assert policy["targetContainerName"]["default"] == "main"
    assert policy["targetRef"]["properties"]["kind"]["enum"] == ["Deployment", "StatefulSet"]


def test_rendered_crds_carry_keep_and_labels(helm_template: Any) -> None:
    docs = [d for d in helm_template() if d["kind"] == "CustomResourceDefinition"]
    assert len(docs) == len(contract.CRDS)
    for doc in docs:
        assert doc["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
        assert doc["metadata"]["labels"]["app.kubernetes.io/component"] == "crds"
    unkept = [d for d in helm_template("--set", "crds.keep=false") if d["kind"] == "CustomResourceDefinition"]
    assert unkept and all("annotations" not in d["metadata"] for d in unkept)
    assert not [d for d in helm_template("--set", "crds.enabled=false") if d["kind"] == "CustomResourceDefinition"]


def test_generator_check_mode_passes() -> None:
    assert GEN.main(["--check"]) == 0
