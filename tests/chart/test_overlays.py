"""The Kustomize harness: overlays/base is the current chart, and every overlay builds."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import kubernetes_validate
import pytest
import yaml

from podsnap import contract
from tests.chart.conftest import REPO, Docs, container, env_of, find, run
from tests.conftest import require_tool

OVERLAYS = REPO / "overlays"
BUILDABLE = sorted(
    str(p.parent.relative_to(OVERLAYS))
    for p in OVERLAYS.rglob("kustomization.yaml")
    if yaml.safe_load(p.read_text()).get("kind") != "Component"
)


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_overlays", REPO / "hack" / "gen_overlays.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_overlays"] = module
    spec.loader.exec_module(module)
    return module


GEN = load_generator()


@pytest.fixture(scope="module")
def built() -> dict[str, Docs]:
    kubectl = require_tool("kubectl")
    out = {}
    for name in BUILDABLE:
        proc = run([kubectl, "kustomize", str(OVERLAYS / name)], check=False)
        assert proc.returncode == 0, f"kubectl kustomize overlays/{name}:\n{proc.stderr}"
        out[name] = [d for d in yaml.safe_load_all(proc.stdout) if d]
    return out


def test_overlays_base_is_not_stale(helm: str) -> None:
    assert GEN.main(["--check"]) == 0, "overlays/base is stale: run `make overlays`"


def test_stale_check_notices_a_changed_base(tmp_path: Path, helm: str) -> None:
    fresh = tmp_path / "fresh"
    GEN.write_base(fresh, GEN.BASE)
    edited = tmp_path / "edited"
    GEN.write_base(edited, GEN.BASE)
    (edited / "deployment-podsnap-operator.yaml").write_text("# hand edit\n")
    (edited / "extra.yaml").write_text("{}\n")
    assert GEN.stale_files(fresh, edited) == ["deployment-podsnap-operator.yaml", "extra.yaml"]
    assert GEN.stale_files(fresh, GEN.BASE) == []


def test_expected_overlays_exist() -> None:
    assert {"base", "local-cluster", "kind-gpu", "kind-cpu", "examples/cloud-rwx", "examples/nfs"} <= set(BUILDABLE)


def test_every_overlay_builds_into_valid_objects(built: dict[str, Docs]) -> None:
    for name, docs in built.items():
        assert len(docs) >= 20, name
        for doc in docs:
            if doc["kind"] != "CustomResourceDefinition":
                kubernetes_validate.validate(doc, "1.37.0", strict=True)


def test_local_cluster_overlay_fits_the_local_cluster(built: dict[str, Docs]) -> None:
    docs = built["local-cluster"]
    ds = find(docs, "DaemonSet", "podsnap-agent")
    spec = ds["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"podsnap.io/local-cluster": "true"}
    # pulled from the local cluster's registry (hack/cluster/up.sh pushes them with `make images-push`)
    for c in spec["containers"] + spec["initContainers"]:
        assert c["image"] == "localhost:5000/podsnap/podsnap-agent:dev" and c["imagePullPolicy"] == "IfNotPresent"
    op = container(find(docs, "Deployment", "podsnap-operator"), "operator")
    assert op["image"] == "localhost:5000/podsnap/podsnap-operator:dev" and op["imagePullPolicy"] == "IfNotPresent"
    paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert paths == {
        "seccomp-dir": "/var/lib/podsnap-cluster/kubelet/seccomp",
        "cgroup": "/sys/fs/cgroup",
        "artifact-cache": "/var/lib/podsnap-cluster/kubelet/podsnap/artifact-cache",
        "agent-state": "/var/lib/podsnap-cluster/kubelet/podsnap/agent-state",
    }
    agent = container(ds, "agent")
    assert env_of(agent)[contract.ENV_CGROUP_ROOT] == contract.CGROUP_ROOT_IN_AGENT
    pvc = find(docs, "PersistentVolumeClaim")
    assert pvc["spec"]["storageClassName"] == "podsnap-local"


def test_kind_and_example_overlays(built: dict[str, Docs]) -> None:
    gpu = find(built["kind-gpu"], "DaemonSet")["spec"]["template"]["spec"]
    assert gpu["runtimeClassName"] == "nvidia" and gpu["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    cpu = find(built["kind-cpu"], "DaemonSet")["spec"]["template"]["spec"]
    assert "nodeSelector" not in cpu and "runtimeClassName" not in cpu
    for name in ("kind-gpu", "kind-cpu"):
        assert find(built[name], "PersistentVolumeClaim")["spec"]["accessModes"] == ["ReadWriteOnce"]
    rwx = find(built["examples/cloud-rwx"], "PersistentVolumeClaim")["spec"]
    assert rwx["accessModes"] == ["ReadWriteMany"] and rwx["storageClassName"] == "efs-sc"
    nfs = built["examples/nfs"]
    pv = find(nfs, "PersistentVolume")
    claim = find(nfs, "PersistentVolumeClaim")
    assert claim["spec"]["volumeName"] == pv["metadata"]["name"]
    assert pv["spec"]["claimRef"] == {"namespace": claim["metadata"]["namespace"], "name": claim["metadata"]["name"]}


def test_base_says_it_is_not_managed_by_helm(built: dict[str, Docs]) -> None:
    for doc in built["base"]:
        assert doc["metadata"].get("labels", {}).get("app.kubernetes.io/managed-by") != "Helm", doc["kind"]
