"""The chart against a real etcd + kube-apiserver (Kubernetes 1.20) with the controller-manager.

No kubelet runs: pods stay Pending, so nothing waits on workloads. What is checked is what the API
server decides: every object accepted, CRDs established, custom resources defaulted, validated and
printed, RBAC effective, and the release lifecycle (reuse-values upgrades, uninstall).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from podsnap import contract
from tests.chart.conftest import CHART, FIGURES, NAMESPACE, RELEASE, REPO, run
from tests.conftest import require_tool
from tests.support.controlplane import ControlPlane

pytestmark = pytest.mark.slow

#: podsnap publishes no images: every install names the registry it pushed them to
REGISTRY = ["--set", "image.registry=registry.example.com/podsnap"]
OVERRIDES = [
    *REGISTRY, "--set", "storage.pvc.size=2Ti", "--set", "webhook.timeoutSeconds=7", "--set", "operator.logLevel=debug",
]  # fmt: skip


@dataclass
class Cluster:
    cp: ControlPlane
    helm: str

    kubectl_bin: str

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        # the pinned kubectl (1.37), not whatever `kubectl` is first on PATH
        argv = [self.kubectl_bin, "--kubeconfig", str(self.cp.kubeconfig), *args]
        return subprocess.run(argv, input=input, text=True, capture_output=True, check=check, timeout=60)

    def helm_run(self, *args: str, check: bool = True, helm: str | None = None) -> subprocess.CompletedProcess[str]:
        proc = run([helm or self.helm, "--kubeconfig", str(self.cp.kubeconfig), *args], check=False, timeout=180)
        if check and proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def get(self, *args: str) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self.kubectl("get", "-o", "json", *args).stdout)
        return out

    def values(self, release: str, namespace: str) -> dict[str, Any]:
        out = self.helm_run("get", "values", release, "-n", namespace, "-o", "json").stdout
        return json.loads(out) or {}


@pytest.fixture(scope="module")
def cluster(control_plane_factory: Any, helm: str) -> Iterator[Cluster]:
    kubectl = require_tool("kubectl")
    start = time.monotonic()
    cp = control_plane_factory("chart", controller_manager=True)
    FIGURES["control plane start"] = f"{time.monotonic() - start:.1f} s"
    c = Cluster(cp, helm, kubectl)
    c.kubectl("create", "namespace", NAMESPACE)
    start = time.monotonic()
    c.helm_run("install", RELEASE, str(CHART), "-n", NAMESPACE, *OVERRIDES)
    FIGURES["helm install into kube-apiserver 1.20"] = f"{time.monotonic() - start:.1f} s"
    yield c


def manifest_objects(c: Cluster, release: str, namespace: str) -> list[dict[str, Any]]:
    text = c.helm_run("get", "manifest", release, "-n", namespace).stdout
    return [d for d in yaml.safe_load_all(text) if d]


def test_an_install_without_an_image_registry_fails_saying_where_images_come_from(cluster: Cluster) -> None:
    proc = cluster.helm_run("install", "no-registry", str(CHART), "-n", NAMESPACE, check=False)
    assert proc.returncode != 0
    assert "image.registry is empty, and podsnap publishes no images" in proc.stderr, proc.stderr
    assert "make images-push REGISTRY=" in proc.stderr
    assert cluster.helm_run("status", "no-registry", "-n", NAMESPACE, check=False).returncode != 0


def test_every_rendered_object_exists_on_the_server(cluster: Cluster) -> None:
    objects = manifest_objects(cluster, RELEASE, NAMESPACE)
    # with the two ClusterRoles aggregated into view and edit, and the operator's Role and RoleBinding
    assert len(objects) == 25
    for obj in objects:
        ns = ["-n", obj["metadata"]["namespace"]] if "namespace" in obj["metadata"] else []
        got = cluster.get(*ns, obj["kind"].lower(), obj["metadata"]["name"])
        assert got["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE


def test_crds_are_established_with_short_names(cluster: Cluster) -> None:
    for kind, (plural, _singular, shorts, namespaced) in contract.CRDS.items():
        name = f"{plural}.{contract.GROUP}"
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=30s")
        crd = cluster.get("crd", name)
        assert crd["spec"]["names"]["shortNames"] == list(shorts)
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        # each short name means exactly this kind (a category of the same name would shadow it)
        proc = cluster.kubectl("get", shorts[0], "absent", *(["-n", "default"] if namespaced else []), check=False)
        assert f'{name} "absent" not found' in proc.stderr, proc.stderr
        res = cluster.kubectl("api-resources", "--api-group", contract.GROUP, "-o", "name").stdout.split()
        assert name in res, kind


GOOD = """
apiVersion: podsnap.io/v1alpha1
kind: SnapshotJob
metadata: {name: capture}
spec:
  podTemplate:
    spec:
      containers: [{name: main, image: demo:1, command: [python, -m, demo]}]
---
apiVersion: podsnap.io/v1alpha1
kind: PodSnapshot
metadata: {name: snap}
spec:
  source: {podRef: {name: worker-0, uid: 1b4e28ba-2fa1-11d2-883f-0016d3cca427}}
---
apiVersion: podsnap.io/v1alpha1
kind: SnapshotPolicy
metadata: {name: worker}
spec:
  targetRef: {kind: Deployment, name: worker}
  startupPolicy: WaitForCheckpoint
---
apiVersion: podsnap.io/v1alpha1
kind: PodSnapshotContent
metadata: {name: podsnapshotcontent-1b4e28ba}
spec:
  podSnapshotRef: {namespace: examples, name: snap, uid: 1b4e28ba}
  source: {podRef: {namespace: examples, name: worker-0}}
  nodeName: gpu-node-1
  artifactPath: examples/snap-1b4e28ba
"""

#: (manifest, field paths the server's message must name)
BAD: list[tuple[str, list[str]]] = [
    (
        "kind: SnapshotPolicy\nmetadata: {name: b1}\nspec: {targetRef: {kind: DaemonSet, name: w}, startupPolicy: Sometimes}",
        ["spec.targetRef.kind", "spec.startupPolicy"],
    ),
    ("kind: SnapshotPolicy\nmetadata: {name: b2}\nspec: {startupPolicy: Immediate}", ["spec.targetRef"]),
    ("kind: SnapshotPolicy\nmetadata: {name: b3}\nspec: {targetRef: {kind: Deployment, name: w}, deletionPolicy: Forget}", ["spec.deletionPolicy"]),
    ("kind: SnapshotPolicy\nmetadata: {name: b10}\nspec: {targetRef: {kind: Deployment, name: w}, restoreFailurePolicy: Retry}", ["spec.restoreFailurePolicy"]),
    ("kind: SnapshotJob\nmetadata: {name: b4}\nspec: {activeDeadlineSeconds: soon, podTemplate: {}}", ["spec.activeDeadlineSeconds"]),
    ("kind: SnapshotJob\nmetadata: {name: b5}\nspec: {activeDeadlineSeconds: 3600}", ["spec.podTemplate"]),
    ("kind: SnapshotJob\nmetadata: {name: b6}\nspec: {podTemplate: {}, activeDeadlineSeconds: 0}", ["spec.activeDeadlineSeconds"]),
    (
        "kind: SnapshotJob\nmetadata: {name: b7}\nspec: {podTemplate: {}, podSnapshotTemplate: {targetContainers: [a, b]}}",
        ["spec.podSnapshotTemplate.targetContainers"],
    ),
    ("kind: PodSnapshot\nmetadata: {name: b8}\nspec: {source: {podRef: {uid: x}}}", ["spec.source.podRef.name"]),
    ("kind: PodSnapshot\nmetadata: {name: b9}", ["spec"]),
]  # fmt: skip


def test_example_resources_are_accepted_and_defaulted(cluster: Cluster) -> None:
    # No operator runs in this suite, so the validating webhook it serves (failurePolicy Fail) would refuse
    # every podsnap object here; it is tested with the operator in tests/operator/test_admission.py.
    hook = cluster.get("validatingwebhookconfiguration", "podsnap-webhook")
    podsnap_objects = [h for h in hook["webhooks"] if h["rules"][0]["apiGroups"] == ["podsnap.io"]]
    assert {h["failurePolicy"] for h in podsnap_objects} == {"Fail"}
    cluster.kubectl("delete", "validatingwebhookconfiguration", "podsnap-webhook")
    cluster.kubectl("create", "namespace", "examples")
    cluster.kubectl("-n", "examples", "create", "-f", "-", input=GOOD)
    job = cluster.get("-n", "examples", "snapjob", "capture")["spec"]
    assert job["activeDeadlineSeconds"] == 3600
    assert job["podSnapshotTemplate"] == {"targetContainers": ["main"]}
    assert job["podTemplate"]["spec"]["containers"][0]["command"] == ["python", "-m", "demo"]  # not pruned
    policy = cluster.get("-n", "examples", "snappolicy", "worker")["spec"]
    assert policy == {
        "targetRef": {"kind": "Deployment", "name": "worker"},
        "startupPolicy": "WaitForCheckpoint",
        "deletionPolicy": "Delete",
        "restoreFailurePolicy": "ColdStart",
        "targetContainerName": "main",
    }
    snap = cluster.get("-n", "examples", "podsnap", "snap")["spec"]
    assert snap["source"]["podRef"]["containers"] == ["main"]
    content = cluster.get("podsnapcontent", "podsnapshotcontent-1b4e28ba")
    assert content["spec"]["deletionPolicy"] == "Delete" and "namespace" not in content["metadata"]


def test_bad_resources_are_rejected_by_the_server_naming_the_field(cluster: Cluster) -> None:
    cluster.kubectl("create", "namespace", "bad-examples", check=False)
    for body, fields in BAD:
        manifest = "apiVersion: podsnap.io/v1alpha1\n" + body
        # --validate=false: the server's CRD schema must reject it, not kubectl's client-side check
        proc = cluster.kubectl(
            "-n", "bad-examples", "create", "--validate=false", "-f", "-", input=manifest, check=False
        )
        assert proc.returncode != 0, f"accepted:\n{manifest}"
        assert "is invalid" in proc.stderr, proc.stderr
        for field in fields:
            assert field in proc.stderr, f"{field} not named in: {proc.stderr}"
    FIGURES["bad custom resources rejected by the API server"] = str(len(BAD))


def test_status_is_a_subresource_and_printed(cluster: Cluster) -> None:
    condition = {
        "type": contract.COND_READY,
        "status": "True",
        "reason": "CaptureCompleted",
        "message": "",
        "lastTransitionTime": "2026-11-30T12:00:00Z",
    }
    status = {
        "status": {
            "conditions": [condition],
            "artifact": {"sizeBytes": 1234, "digest": "sha256:ab"},
            "source": {"node": "gpu-node-1"},
        }
    }
    cluster.kubectl(
        "-n", "examples", "patch", "podsnap", "snap", "--subresource=status", "--type=merge", "-p", json.dumps(status)
    )
    # a write of the main resource does not touch status
    cluster.kubectl("-n", "examples", "label", "podsnap", "snap", "x=y")
    got = cluster.get("-n", "examples", "podsnap", "snap")["status"]
    assert got["conditions"][0]["reason"] == "CaptureCompleted" and got["artifact"]["sizeBytes"] == 1234
    table = cluster.kubectl("-n", "examples", "get", "podsnap", "snap").stdout.splitlines()
    assert table[0].split()[:5] == ["NAME", "READY", "REASON", "NODE", "SIZE"]
    assert table[1].split()[:5] == ["snap", "True", "CaptureCompleted", "gpu-node-1", "1234"]
    bad = {"status": {"conditions": [{**condition, "status": "Maybe"}]}}
    proc = cluster.kubectl(
        "-n",
        "examples",
        "patch",
        "podsnap",
        "snap",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(bad),
        check=False,
    )
    assert proc.returncode != 0 and "status.conditions" in proc.stderr
    policy = cluster.kubectl("-n", "examples", "get", "snappolicy", "worker").stdout.splitlines()[0].split()
    assert policy[:6] == ["NAME", "KIND", "TARGET", "STARTUP", "READY", "CHECKPOINT"]


def can_i(c: Cluster, sa: str, verb: str, resource: str, *extra: str) -> bool:
    proc = c.kubectl(
        "auth", "can-i", verb, resource, f"--as=system:serviceaccount:{NAMESPACE}:{sa}", *extra, check=False
    )
    return proc.stdout.strip() == "yes"


def test_rbac_on_the_server_is_least_privilege(cluster: Cluster) -> None:
    op, agent = "podsnap-operator", "podsnap-agent"
    assert can_i(cluster, op, "create", "snapshotjobs.podsnap.io", "-A")
    # `kubectl auth can-i VERB RESOURCE/NAME`: a subresource needs --subresource, not a slash
    assert can_i(cluster, op, "update", "podsnapshots.podsnap.io", "--subresource=status", "-A")
    assert can_i(cluster, op, "patch", "snapshotjobs.podsnap.io", "--subresource=status", "-A")
    assert not can_i(cluster, op, "update", "snapshotpolicies.podsnap.io", "-A")
    # placement: the Restored condition of pods the webhook could not place (but no other write to pods)
    assert can_i(cluster, op, "patch", "pods", "--subresource=status", "-A")
    assert can_i(cluster, op, "create", "jobs.batch", "-n", "examples")
    assert can_i(cluster, op, "patch", "deployments.apps", "-n", "examples")
    assert can_i(cluster, op, "patch", "mutatingwebhookconfigurations/podsnap-webhook")
    assert not can_i(cluster, op, "patch", "mutatingwebhookconfigurations/someone-elses")
    assert not can_i(cluster, op, "get", "secrets", "-A")
    assert not can_i(cluster, op, "create", "pods", "-n", "examples")
    assert can_i(cluster, agent, "patch", "podsnapshotcontents.podsnap.io", "--subresource=status")
    assert can_i(cluster, agent, "patch", "pods", "--subresource=status", "-n", "examples")
    assert not can_i(cluster, agent, "patch", "podsnapshots.podsnap.io", "--subresource=status", "-A")
    assert not can_i(cluster, agent, "get", "nodes")
    # placement: the labels of its own Node (the webhook refuses any other); never its status
    assert can_i(cluster, agent, "patch", "nodes")
    assert not can_i(cluster, agent, "patch", "nodes", "--subresource=status")
    assert not can_i(cluster, agent, "update", "nodes")
    assert not can_i(cluster, agent, "list", "podsnapshots.podsnap.io", "-A")
    assert not can_i(cluster, op, "patch", "pods", "-n", "examples")
    assert not can_i(cluster, op, "delete", "snapshotpolicies.podsnap.io", "-n", "examples")
    assert not can_i(cluster, agent, "create", "podsnapshotcontents.podsnap.io")
    assert not can_i(cluster, agent, "patch", "podsnapshots.podsnap.io", "-n", "examples")
    assert not can_i(cluster, agent, "list", "secrets", "-A")
    assert not can_i(cluster, agent, "delete", "pods", "-n", "examples")


def test_the_built_in_view_and_edit_roles_cover_podsnap_objects(cluster: Cluster) -> None:
    """The controller-manager aggregates the chart's roles into `view` and `edit`: a namespace reader reads
    policies, an editor writes them, and neither reaches the cluster-scoped contents."""
    ns = "team-a"
    cluster.kubectl("create", "namespace", ns)
    cluster.kubectl("create", "rolebinding", "readers", "--clusterrole=view", "--user=reader", "-n", ns)
    cluster.kubectl("create", "rolebinding", "editors", "--clusterrole=edit", "--user=editor", "-n", ns)

    def can(user: str, verb: str, resource: str, *extra: str) -> bool:
        proc = cluster.kubectl("auth", "can-i", verb, resource, "-n", ns, f"--as={user}", *extra, check=False)
        return proc.stdout.strip() == "yes"

    deadline = time.monotonic() + 30
    while not (
        can("reader", "list", "snapshotpolicies.podsnap.io") and can("editor", "create", "podsnapshots.podsnap.io")
    ):
        assert time.monotonic() < deadline, "view/edit never gained podsnap's rules (clusterrole-aggregation)"
        time.sleep(0.2)
    assert can("reader", "watch", "podsnapshots.podsnap.io") and can("reader", "get", "snapshotjobs.podsnap.io")
    assert not can("reader", "create", "snapshotpolicies.podsnap.io")
    assert can("editor", "delete", "snapshotpolicies.podsnap.io")
    assert not can("editor", "patch", "snapshotpolicies.podsnap.io", "--subresource=status")
    for user in ("reader", "editor"):
        assert not can(user, "get", "podsnapshotcontents.podsnap.io")


def test_local_cluster_overlay_is_accepted_by_a_1_20_server(cluster: Cluster) -> None:
    built = cluster.kubectl("kustomize", str(REPO / "overlays" / "local-cluster")).stdout
    docs = [d for d in yaml.safe_load_all(built) if d]
    # into a namespace of its own, so the release installed above does not collide with it
    for doc in docs:
        if doc["kind"] == "Namespace":
            doc["metadata"]["name"] = "overlay-check"
        elif "namespace" in doc["metadata"]:
            doc["metadata"]["namespace"] = "overlay-check"
    cluster.kubectl("create", "namespace", "overlay-check")
    manifest = yaml.safe_dump_all([d for d in docs if d["kind"] != "Namespace"])
    proc = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=manifest, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("(server dry run)") == len(docs) - 1


def secret_data(c: Cluster, namespace: str, name: str) -> dict[str, str]:
    data: dict[str, str] = c.get("-n", namespace, "secret", name)["data"]
    return data


def ca_bundle(c: Cluster, name: str) -> str:
    bundle: str = c.get("mutatingwebhookconfiguration", name)["webhooks"][0]["clientConfig"]["caBundle"]
    return bundle


def test_reuse_values_upgrade_keeps_overrides_and_certificate(cluster: Cluster) -> None:
    before = secret_data(cluster, NAMESPACE, "podsnap-webhook-tls")
    token_key = secret_data(cluster, NAMESPACE, "podsnap-token-key")  # the pods marked with it stay valid
    assert ca_bundle(cluster, "podsnap-webhook") == before["ca.crt"]
    cluster.helm_run("upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "--reuse-values", "--set", "agent.logLevel=debug")
    assert secret_data(cluster, NAMESPACE, "podsnap-webhook-tls") == before
    assert secret_data(cluster, NAMESPACE, "podsnap-token-key") == token_key
    assert ca_bundle(cluster, "podsnap-webhook") == before["ca.crt"]
    values = cluster.values(RELEASE, NAMESPACE)
    assert values["storage"]["pvc"]["size"] == "2Ti" and values["agent"]["logLevel"] == "debug"
    hook = cluster.get("mutatingwebhookconfiguration", "podsnap-webhook")["webhooks"][0]
    assert hook["timeoutSeconds"] == 7
    deploy = cluster.get("-n", NAMESPACE, "deployment", "podsnap-operator")
    env = {e["name"]: e.get("value") for e in deploy["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env[contract.ENV_LOG_LEVEL] == "debug"
    # a plain upgrade (values from scratch) finds the Secret with `lookup` and keeps it too
    cluster.helm_run("upgrade", RELEASE, str(CHART), "-n", NAMESPACE, *OVERRIDES)
    assert secret_data(cluster, NAMESPACE, "podsnap-webhook-tls") == before
    assert secret_data(cluster, NAMESPACE, "podsnap-token-key") == token_key
    revision = cluster.helm_run("history", RELEASE, "-n", NAMESPACE, "-o", "json").stdout
    assert [r["status"] for r in json.loads(revision)] == ["superseded", "superseded", "deployed"]


def test_uninstall_keeps_the_claim_and_the_crds(cluster: Cluster) -> None:
    cluster.helm_run("uninstall", RELEASE, "-n", NAMESPACE)
    assert cluster.kubectl("-n", NAMESPACE, "get", "deployment", "podsnap-operator", check=False).returncode != 0
    assert cluster.kubectl("get", "mutatingwebhookconfiguration", "podsnap-webhook", check=False).returncode != 0
    pvc = cluster.get("-n", NAMESPACE, "pvc", "podsnap-artifacts")
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    for plural, *_ in contract.CRDS.values():
        cluster.get("crd", f"{plural}.{contract.GROUP}")
    # and user objects survive with them
    assert cluster.get("-n", "examples", "snappolicy", "worker")["spec"]["startupPolicy"] == "WaitForCheckpoint"


def test_the_walkthrough_upgrade_can_be_repeated_with_a_values_file_that_removes_a_default_key(
    cluster: Cluster,
) -> None:
    """`helm upgrade --install --reuse-values -f values.yaml` twice: the null that removed the default node
    selector is stored in the release and fed back through the schema on the second upgrade."""
    release, ns = "walkthrough", "walkthrough"
    values = REPO / "overlays" / "local-cluster" / "values.yaml"
    args = ("upgrade", "--install", release, str(CHART), "-n", ns, "--create-namespace", "--reuse-values")
    for _ in range(2):
        cluster.helm_run(*args, "-f", str(values), "--set", "crds.enabled=false")
    ds = cluster.get("-n", ns, "daemonset", f"{release}-podsnap-agent")
    assert ds["spec"]["template"]["spec"]["nodeSelector"] == {"podsnap.io/local-cluster": "true"}
