"""examples/<engine>: each builds with kustomize, the built-in kinds pass `kubernetes-validate --strict`,
the SnapshotPolicy passes the chart CRD's schema made strict (unknown fields rejected), and the
pieces fit together (policy -> Deployment -> container, engine annotation, safe env, entrypoint)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from podsnap.workload.engines.checkpoint_env import ANNOTATION_ENGINE, ENGINES, safe_env
from tests.conftest import require_tool

REPO = Path(__file__).resolve().parents[2]


def crd_schema(kind: str) -> dict[str, Any]:
    spec = importlib.util.spec_from_file_location("chart_crds", REPO / "hack" / "chart_crds.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return strict(module.crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


def strict(node: Any) -> Any:
    """The structural schema with unknown fields rejected, as `kubectl --validate=strict` does."""
    if isinstance(node, dict):
        out = {k: strict(v) for k, v in node.items()}
        if out.get("type") == "object" and "properties" in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out.setdefault("additionalProperties", False)
        return out
    if isinstance(node, list):
        return [strict(v) for v in node]
    return node


def build(engine: str) -> list[dict[str, Any]]:
    kubectl = require_tool("kubectl")
    out = subprocess.run(
        [kubectl, "kustomize", str(REPO / "examples" / engine)], capture_output=True, text=True, check=True
    )
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_every_engine_has_an_example() -> None:
    assert sorted(p.name for p in (REPO / "examples").iterdir() if p.is_dir()) == sorted(ENGINES)


@pytest.mark.parametrize("engine", ENGINES)
def test_example_builds_and_its_builtin_kinds_validate_strictly(engine: str, tmp_path: Path) -> None:
    docs = build(engine)
    assert {"Deployment", "Service", "SnapshotPolicy"} <= {d["kind"] for d in docs}
    builtin = tmp_path / "builtin.yaml"
    builtin.write_text(yaml.safe_dump_all([d for d in docs if "podsnap.io" not in d["apiVersion"]]))
    validate = Path(sys.executable).parent / "kubernetes-validate"
    out = subprocess.run(
        [str(validate), "--strict", "--quiet", str(builtin)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("engine", ENGINES)
def test_example_policy_fits_the_crd_and_targets_a_shaped_deployment(engine: str) -> None:
    docs = build(engine)
    policy = next(d for d in docs if d["kind"] == "SnapshotPolicy")
    jsonschema.validate(policy, crd_schema("SnapshotPolicy"))
    target = policy["spec"]["targetRef"]
    deployment = next(d for d in docs if d["kind"] == target["kind"] and d["metadata"]["name"] == target["name"])
    template = deployment["spec"]["template"]
    assert template["metadata"]["annotations"][ANNOTATION_ENGINE] == engine
    main = next(
        c for c in template["spec"]["containers"] if c["name"] == policy["spec"].get("targetContainerName", "main")
    )
    assert main["command"][:6] == ["podsnap-run", "--", "python", "-m", "podsnap.workload.engines", engine]
    env = {e["name"]: e.get("value") for e in main.get("env", [])}
    assert safe_env(engine).items() <= env.items()
    service = next(d for d in docs if d["kind"] == "Service")
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()


def test_the_strict_schema_rejects_an_unknown_policy_field() -> None:
    policy = {
        "apiVersion": "podsnap.io/v1alpha1",
        "kind": "SnapshotPolicy",
        "metadata": {"name": "x"},
        "spec": {"targetRef": {"kind": "Deployment", "name": "x"}, "startupPolcy": "WaitForCheckpoint"},
    }
    with pytest.raises(jsonschema.ValidationError, match="startupPolcy"):
        jsonschema.validate(policy, crd_schema("SnapshotPolicy"))
