"""`podsnap status` against a real kube-apiserver, run as the user runs it (a subprocess with a kubeconfig).

The podsnap objects are written here as the operator and the agent leave them (no operator runs in this
module): a policy whose checkpoint is Ready with its artifact, source and capture timings; pods that were
restored (Restored=True and the agent's restore-timings annotation), whose restore was refused, or that
started cold; and a second policy whose capture failed. Read-only identities come from ServiceAccount
tokens and Roles (RBAC authorizer on).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from podsnap import contract as c
from podsnap.kube.client import Credentials, Kube
from tests.conftest import REPO, ControlPlaneFactory, require_tool
from tests.support.controlplane import ControlPlane, free_port

NS = "shop"
NOW = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
CAPTURE_MS = {"cuda_checkpoint": 2100.2, "criu_dump": 5300.5, "publish": 40.0, "total": 7500.7, "agent_total": 7612.3}
RESTORE_MS = {"verify": 750.0, "criu_restore": 1200.5, "cuda_restore": 900.2, "total": 2850.7, "agent_total": 3104.9}
SIZE = 1_288_490_189  # 1.2 GiB
DIGEST = "sha256:" + "ab" * 32
GATE_MESSAGE = "gate driver: expected '580.159.04', found '550.54.15'; restore on a node with the capture's driver"
CAPTURE_MESSAGE = "criu dump: Can't dump the process tree (pid 7); the log is /var/lib/podsnap/logs/api-def.log"


def stamp(minutes_ago: float) -> str:
    return (NOW - datetime.timedelta(minutes=minutes_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(type_: str, status: bool, reason: str, message: str, minutes_ago: float) -> dict[str, Any]:
    return {
        "type": type_,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": stamp(minutes_ago),
    }


@dataclass
class Cluster:
    cp: ControlPlane
    kube: Kube
    tmp: Path
    #: `podsnap status` before podsnap's CRDs were installed
    without_crds: subprocess.CompletedProcess[str]

    def cr(self, plural: str, body: dict[str, Any], status: dict[str, Any]) -> None:
        body = {"apiVersion": c.API_VERSION, **body}
        name = body["metadata"]["name"]
        self.kube.custom.create_namespaced_custom_object(c.GROUP, c.VERSION, NS, plural, body)
        self.kube.custom.patch_namespaced_custom_object_status(
            c.GROUP, c.VERSION, NS, plural, name, {"status": status}, _content_type="application/merge-patch+json"
        )

    def pod(
        self, name: str, app: str, *, node: str | None, annotations: dict[str, str] | None = None, **kw: Any
    ) -> None:
        """A pod as the webhook shaped it (or not) and the kubelet (played here) reported it."""
        labels = {"app": app}
        if annotations and c.ANNOTATION_RESTORE_FROM in annotations:
            labels[c.LABEL_RESTORE] = "true"
        spec: dict[str, Any] = {"containers": [{"name": "main", "image": "worker:1"}], **kw}
        if node:
            spec["nodeName"] = node
        meta = {"name": name, "labels": labels, "annotations": annotations or {}}
        self.kube.core.create_namespaced_pod(NS, {"metadata": meta, "spec": spec})

    def pod_status(self, name: str, *, ready: bool, restored: dict[str, Any] | None = None) -> None:
        conds = [{"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": stamp(1)}]
        if restored is not None:
            conds.append(restored)
        body = {"status": {"phase": "Running", "podIP": "10.244.0.9", "conditions": conds}}
        self.kube.core.patch_namespaced_pod_status(name, NS, body)

    def viewer(self, name: str, rules: list[dict[str, Any]]) -> Path:
        """A kubeconfig of ServiceAccount `name`, bound in NS to a Role with exactly `rules`."""
        self.kube.core.create_namespaced_service_account(NS, {"metadata": {"name": name}})
        rbac = self.kube.client  # the RBAC API over the same admin client
        from kubernetes import client as k8s

        api = k8s.RbacAuthorizationV1Api(rbac)
        api.create_namespaced_role(NS, {"metadata": {"name": name}, "rules": rules})
        api.create_namespaced_role_binding(
            NS,
            {
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": NS}],
            },
        )
        token = self.cp.service_account_token(NS, name)
        return self.cp.token_kubeconfig(token, self.tmp / f"{name}.kubeconfig", name)


def read_only_rules(*, pods: bool = True) -> list[dict[str, Any]]:
    rules = [
        {
            "apiGroups": [c.GROUP],
            "resources": [c.PLURAL_SNAPSHOT_POLICIES, c.PLURAL_POD_SNAPSHOTS, c.PLURAL_SNAPSHOT_JOBS],
            "verbs": ["get", "list"],
        },
        {"apiGroups": ["apps"], "resources": ["deployments", "statefulsets"], "verbs": ["get", "list"]},
    ]
    if pods:
        rules.append({"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]})
    return rules


@pytest.fixture(scope="module")
def cluster(control_plane_factory: ControlPlaneFactory, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    helm = require_tool("helm")
    require_tool("kubectl")
    cp = control_plane_factory("status")
    rendered = subprocess.run(
        [helm, "template", "podsnap", str(REPO / "charts" / "podsnap"), "-n", "podsnap-system"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    crds = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "CustomResourceDefinition"]
    without_crds = podsnap("policy/web", "-n", NS, kubeconfig=cp.kubeconfig)
    # --validate=false: the 1.20 server's OpenAPI predates x-kubernetes-validations (as in tests/operator)
    cp.kubectl("apply", "--validate=false", "-f", "-", input=yaml.safe_dump_all(crds))
    for crd in crds:
        cp.kubectl("wait", "--for=condition=Established", f"crd/{crd['metadata']['name']}", "--timeout=30s")
    kube = Kube(Credentials.load(cp.kubeconfig).api_client())
    for node in ("node-a", "node-b"):  # bound pods of a missing Node would be garbage-collected
        kube.core.create_node({"metadata": {"name": node}})
    kube.core.create_namespace({"metadata": {"name": NS}})
    cluster = Cluster(cp, kube, tmp_path_factory.mktemp("status"), without_crds)
    seed(cluster)
    yield cluster


def deployment(name: str) -> dict[str, Any]:
    # replicas 0: the controller-manager makes no pods of its own; the test's pods carry the selector's labels
    labels = {"app": name}
    return {
        "metadata": {"name": name},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "main", "image": "w:1"}]}},
        },
    }


def seed(k: Cluster) -> None:
    """The objects of two policies: `web` (checkpoint Ready, pods restored / refused / cold) and `api`
    (capture failed)."""
    k.kube.apps.create_namespaced_deployment(NS, deployment("web"))
    k.kube.apps.create_namespaced_deployment(NS, deployment("api"))
    owned = {c.LABEL_POLICY: "web", c.LABEL_SNAPSHOT_JOB: "web-abc"}
    k.cr(
        c.PLURAL_SNAPSHOT_POLICIES,
        {
            "kind": c.KIND_SNAPSHOT_POLICY,
            "metadata": {"name": "web"},
            "spec": {"targetRef": {"kind": "Deployment", "name": "web"}, "startupPolicy": "WaitForCheckpoint"},
        },
        {
            "ready": True,
            "checkpointName": "web-abc",
            "templateHash": "abc",
            "snapshotJobName": "web-abc",
            "conditions": [
                condition(c.COND_READY, True, c.REASON_CHECKPOINT_READY, "new pods restore from web-abc", 10)
            ],
        },
    )
    k.cr(
        c.PLURAL_SNAPSHOT_JOBS,
        {
            "kind": c.KIND_SNAPSHOT_JOB,
            "metadata": {"name": "web-abc", "labels": {c.LABEL_POLICY: "web"}},
            "spec": {"podTemplate": {"spec": {"containers": [{"name": "main", "image": "w:1"}]}}},
        },
        {
            "podSnapshotName": "web-abc",
            "podName": "web-abc-x7",
            "conditions": [
                condition(c.COND_CAPTURED, True, c.REASON_CAPTURE_COMPLETED, "captured", 10),
                condition(c.COND_COMPLETED, True, c.REASON_JOB_COMPLETED, "done", 10),
            ],
        },
    )
    k.cr(
        c.PLURAL_POD_SNAPSHOTS,
        {
            "kind": c.KIND_POD_SNAPSHOT,
            "metadata": {"name": "web-abc", "labels": owned},
            "spec": {"source": {"podRef": {"name": "web-abc-x7", "containers": ["main"]}}},
        },
        {
            "boundSnapshotContentName": "podsnapshotcontent-1234",
            "artifact": {"sizeBytes": SIZE, "digest": DIGEST},
            "source": {
                "node": "node-a",
                "kernel": "6.1.0-27-amd64",
                "arch": "x86_64",
                "glibc": "2.36",
                "driver": "580.159.04",
                "gpus": [{"index": 0, "uuid": "GPU-1", "name": "NVIDIA H200"}],
            },
            "capturedAt": stamp(10),
            "captureTimingsMs": CAPTURE_MS,
            "conditions": [condition(c.COND_READY, True, c.REASON_CAPTURE_COMPLETED, "captured", 10)],
        },
    )
    restored = {c.ANNOTATION_RESTORE_FROM: "web-abc", c.ANNOTATION_RESTORE_TIMINGS: c.format_timings(RESTORE_MS)}
    k.pod("web-restored", "web", node="node-a", annotations=restored)
    k.pod_status(
        "web-restored",
        ready=True,
        restored=condition(c.POD_CONDITION_RESTORED, True, c.REASON_RESTORE_SUCCEEDED, "restored in 3.10 s", 3),
    )
    k.pod("web-refused", "web", node="node-b", annotations={c.ANNOTATION_RESTORE_FROM: "web-abc"})
    k.pod_status(
        "web-refused",
        ready=False,
        restored=condition(c.POD_CONDITION_RESTORED, False, c.REASON_RESTORE_INCOMPATIBLE, GATE_MESSAGE, 2),
    )
    k.pod("web-cold", "web", node="node-b")  # made now, long after the checkpoint was Ready: the webhook missed it
    k.pod_status("web-cold", ready=True)

    k.cr(
        c.PLURAL_SNAPSHOT_POLICIES,
        {
            "kind": c.KIND_SNAPSHOT_POLICY,
            "metadata": {"name": "api"},
            "spec": {"targetRef": {"kind": "Deployment", "name": "api"}},
        },
        {
            "ready": False,
            "checkpointName": "api-def",
            "snapshotJobName": "api-def",
            "conditions": [
                condition(c.COND_READY, False, c.REASON_CHECKPOINT_FAILED, "PodSnapshot api-def failed (…)", 4)
            ],
        },
    )
    k.cr(
        c.PLURAL_SNAPSHOT_JOBS,
        {
            "kind": c.KIND_SNAPSHOT_JOB,
            "metadata": {"name": "api-def", "labels": {c.LABEL_POLICY: "api"}},
            "spec": {"podTemplate": {"spec": {"containers": [{"name": "main", "image": "a:1"}]}}},
        },
        {"conditions": [condition(c.COND_FAILED, True, c.REASON_CAPTURE_FAILED, CAPTURE_MESSAGE, 5)]},
    )
    k.cr(
        c.PLURAL_POD_SNAPSHOTS,
        {
            "kind": c.KIND_POD_SNAPSHOT,
            "metadata": {"name": "api-def", "labels": {c.LABEL_POLICY: "api", c.LABEL_SNAPSHOT_JOB: "api-def"}},
            "spec": {"source": {"podRef": {"name": "api-def-q2", "containers": ["main"]}}},
        },
        {
            "boundSnapshotContentName": "podsnapshotcontent-5678",
            "conditions": [
                condition(c.COND_FAILED, True, c.REASON_CAPTURE_FAILED, CAPTURE_MESSAGE, 6),
                condition(c.COND_READY, False, c.REASON_CAPTURE_FAILED, CAPTURE_MESSAGE, 6),
            ],
        },
    )
    k.pod("api-1", "api", node="node-a")
    k.pod_status("api-1", ready=True)


def podsnap(
    *args: str, kubeconfig: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "podsnap", "status", *args]
    if kubeconfig is not None:
        argv += ["--kubeconfig", str(kubeconfig)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, check=False)


def status_json(*args: str, kubeconfig: Path) -> dict[str, Any]:
    got = podsnap(*args, "-o", "json", kubeconfig=kubeconfig)
    assert got.returncode == 0, got.stderr
    return dict(json.loads(got.stdout))


def minutes(pattern: str, text: str) -> int:
    """The minutes of an age in `text` (the objects' times are minutes before the module started)."""
    found = re.search(pattern, text)
    assert found, f"{pattern!r} not in:\n{text}"
    return int(found.group(1))


def pods_by_name(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in doc["pods"]}


def test_policy_status_shows_checkpoint_timings_and_how_each_pod_started(cluster: Cluster) -> None:
    doc = status_json("policy/web", "-n", NS, kubeconfig=cluster.cp.kubeconfig)
    assert doc["apiVersion"] == "podsnap.io/v1alpha1" and doc["kind"] == "StatusReport"
    assert doc["target"] == {"kind": c.KIND_SNAPSHOT_POLICY, "namespace": NS, "name": "web"}
    assert doc["policy"]["ready"] is True and doc["policy"]["checkpointName"] == "web-abc"
    cp = doc["checkpoint"]
    assert (cp["name"], cp["state"], cp["node"], cp["sizeBytes"], cp["digest"]) == (
        "web-abc",
        "Ready",
        "node-a",
        SIZE,
        DIGEST,
    )
    # stamped 10 min before NOW, which was taken when this module was collected (maybe long ago in a full run)
    expected_age = (datetime.datetime.now(datetime.UTC) - NOW).total_seconds() + 600
    assert abs(cp["ageSeconds"] - expected_age) <= 120, (cp["ageSeconds"], expected_age)
    assert cp["captureTimingsMs"] == CAPTURE_MS
    assert cp["source"]["gpus"] == ["NVIDIA H200"] and cp["source"]["driver"] == "580.159.04"
    assert doc["snapshotJob"]["state"] == c.COND_COMPLETED

    pods = pods_by_name(doc)
    assert set(pods) == {"web-restored", "web-refused", "web-cold"}, "api-1 is not a pod of web's Deployment"
    assert pods["web-restored"]["start"] == "restored"
    assert pods["web-restored"]["restoreTimingsMs"] == RESTORE_MS
    assert (pods["web-refused"]["start"], pods["web-refused"]["reason"]) == ("fallback", c.REASON_RESTORE_INCOMPATIBLE)
    assert pods["web-refused"]["message"] == GATE_MESSAGE
    assert (pods["web-cold"]["start"], pods["web-cold"]["reason"]) == ("cold", "NotShaped")
    failure = doc["lastFailure"]
    assert failure["object"] == "Pod/web-refused" and failure["reason"] == c.REASON_RESTORE_INCOMPATIBLE
    assert doc["warnings"] == []

    text = podsnap("policy/web", "-n", NS, kubeconfig=cluster.cp.kubeconfig)
    assert text.returncode == 0, text.stderr
    out = text.stdout
    print(out)
    assert f"SnapshotPolicy {NS}/web  ->  Deployment web  (WaitForCheckpoint)" in out
    assert minutes(r"checkpoint  PodSnapshot web-abc  Ready  \(captured (\d+)m ago\)", out) >= 10
    assert "node-a  (x86_64, kernel 6.1.0-27-amd64, driver 580.159.04, 1 GPU: NVIDIA H200)" in out
    assert "1.2 GiB  sha256:abababababab…  content podsnapshotcontent-1234" in out
    assert "7.50 s: cuda_checkpoint 2.10 s · criu_dump 5.30 s · publish 0.04 s (agent 7.61 s)" in out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("  web-")}
    assert rows["web-restored"].split()[1:4] == ["node-a", "yes", "restored"]
    assert "2.85 s: verify 0.75 s · criu_restore 1.20 s · cuda_restore 0.90 s (agent 3.10 s)" in rows["web-restored"]
    assert rows["web-refused"].split()[1:4] == ["node-b", "no", "fallback"]
    assert f"RestoreIncompatible: {GATE_MESSAGE}" in rows["web-refused"]
    assert rows["web-cold"].split()[3:5] == ["cold", "NotShaped:"]
    assert minutes(r"last failure  Pod/web-refused \((\d+)m ago\)  RestoreIncompatible: gate driver", out) >= 2


def test_failed_capture_is_the_last_failure_with_its_reason(cluster: Cluster) -> None:
    doc = status_json("snappolicy/api", "-n", NS, kubeconfig=cluster.cp.kubeconfig)
    assert doc["policy"]["ready"] is False and doc["policy"]["reason"] == c.REASON_CHECKPOINT_FAILED
    assert doc["checkpoint"]["state"] == "Failed" and doc["checkpoint"]["reason"] == c.REASON_CAPTURE_FAILED
    assert doc["snapshotJob"]["state"] == c.COND_FAILED
    # the root cause (the PodSnapshot's), not the policy's wrapper of it
    assert doc["lastFailure"] == {
        "object": "PodSnapshot/api-def",
        "reason": c.REASON_CAPTURE_FAILED,
        "message": CAPTURE_MESSAGE,
        "at": stamp(6),
    }
    [pod] = doc["pods"]
    assert (pod["name"], pod["start"], pod["reason"]) == ("api-1", "cold", "CheckpointNotReady")

    out = podsnap("podsnapshot/api-def", "-n", NS, kubeconfig=cluster.cp.kubeconfig).stdout
    assert f"checkpoint  PodSnapshot api-def  Failed  CaptureFailed: {CAPTURE_MESSAGE}" in out
    assert "job         SnapshotJob api-def  Failed  CaptureFailed" in out
    assert minutes(r"last failure  PodSnapshot/api-def \((\d+)m ago\)  CaptureFailed: criu dump", out) >= 6


def test_snapshot_and_pod_views(cluster: Cluster) -> None:
    snap = status_json("podsnap/web-abc", "-n", NS, kubeconfig=cluster.cp.kubeconfig)
    assert snap["checkpoint"]["state"] == "Ready" and snap["policy"]["name"] == "web"
    assert snap["snapshotJob"]["name"] == "web-abc"
    # the pods that restore (or tried to) from this snapshot; the cold pod never referred to it
    assert set(pods_by_name(snap)) == {"web-restored", "web-refused"}

    pod = status_json("pod/web-restored", "-n", NS, kubeconfig=cluster.cp.kubeconfig)
    assert pod["policy"]["name"] == "web" and pod["checkpoint"]["name"] == "web-abc"
    [view] = pod["pods"]
    assert view["start"] == "restored" and view["restoreTimingsMs"] == RESTORE_MS and view["node"] == "node-a"
    text = podsnap("pods", "web-restored", "-n", NS, kubeconfig=cluster.cp.kubeconfig).stdout
    assert f"Pod {NS}/web-restored  on node-a  Running, Ready" in text
    assert "restore     2.85 s: verify 0.75 s" in text and "policy      SnapshotPolicy web" in text

    cold = status_json("pod/web-cold", "-n", NS, kubeconfig=cluster.cp.kubeconfig)
    assert cold["pods"][0]["start"] == "cold" and cold["pods"][0]["reason"] == "NotShaped"


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("policy/nope", f"SnapshotPolicy 'nope' not found in namespace '{NS}'"),
        ("podsnapshot/nope", f"PodSnapshot 'nope' not found in namespace '{NS}'"),
        ("snapjob/nope", f"SnapshotJob 'nope' not found in namespace '{NS}'"),
        ("pod/nope", f"Pod 'nope' not found in namespace '{NS}'"),
    ],
)
def test_a_missing_object_is_named_with_exit_code_1(cluster: Cluster, target: str, message: str) -> None:
    got = podsnap(target, "-n", NS, kubeconfig=cluster.cp.kubeconfig)
    assert got.returncode == 1 and got.stdout == ""
    assert message in got.stderr and "kubectl get" in got.stderr


def test_bad_arguments_and_an_unreachable_server(cluster: Cluster, tmp_path: Path) -> None:
    got = podsnap("widget/x", "-n", NS, kubeconfig=cluster.cp.kubeconfig)
    assert got.returncode == 2 and "unknown kind 'widget'" in got.stderr
    got = podsnap("policy/a", "extra", kubeconfig=cluster.cp.kubeconfig)
    assert got.returncode == 2 and "expected KIND/NAME" in got.stderr

    dead = tmp_path / "dead.kubeconfig"
    dead.write_text(cluster.cp.kubeconfig.read_text().replace(cluster.cp.server, f"https://127.0.0.1:{free_port()}"))
    got = podsnap("policy/web", "-n", NS, "--request-timeout", "5", kubeconfig=dead)
    assert got.returncode == 3 and "cannot reach the API server at https://127.0.0.1:" in got.stderr


def test_a_cluster_without_podsnap_says_so(cluster: Cluster) -> None:
    got = cluster.without_crds
    assert got.returncode == 1
    assert "does not serve snapshotpolicies.podsnap.io: are podsnap's CRDs installed" in got.stderr


def test_namespace_and_credentials_come_from_kubeconfig_like_kubectl(cluster: Cluster, tmp_path: Path) -> None:
    """KUBECONFIG (no flag) and the context's namespace (no -n) are used."""
    config = yaml.safe_load(cluster.cp.kubeconfig.read_text())
    config["contexts"][0]["context"]["namespace"] = NS
    path = tmp_path / "ns.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    got = podsnap("policy/web", "-o", "json", env={**os.environ, "KUBECONFIG": str(path)})
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["target"]["namespace"] == NS


def test_a_read_only_role_is_enough(cluster: Cluster) -> None:
    """get/list on the objects status reads, in the one namespace, and nothing else."""
    viewer = cluster.viewer("viewer", read_only_rules())
    admin = status_json("policy/web", "-n", NS, kubeconfig=cluster.cp.kubeconfig)
    mine = status_json("policy/web", "-n", NS, kubeconfig=viewer)
    for doc in (admin, mine):
        doc.pop("generatedAt")
        doc["checkpoint"].pop("ageSeconds")
    assert mine == admin
    for target in ("podsnapshot/web-abc", "pod/web-restored", "snapjob/api-def"):
        assert status_json(target, "-n", NS, kubeconfig=viewer)["warnings"] == []


def test_a_forbidden_auxiliary_read_is_a_warning_the_object_itself_an_error(cluster: Cluster) -> None:
    no_pods = cluster.viewer("no-pods", read_only_rules(pods=False))
    doc = status_json("policy/web", "-n", NS, kubeconfig=no_pods)
    assert doc["checkpoint"]["state"] == "Ready" and doc["pods"] == []
    [warning] = doc["warnings"]
    assert warning.startswith(f"not allowed to read pods in {NS}") and "cannot list resource" in warning
    text = podsnap("policy/web", "-n", NS, kubeconfig=no_pods).stdout
    assert "warnings\n  not allowed to read pods" in text

    nothing = cluster.viewer("nothing", [])
    got = podsnap("policy/web", "-n", NS, kubeconfig=nothing)
    assert got.returncode == 3
    assert f"not allowed to read snapshotpolicies.podsnap.io {NS}/web" in got.stderr and "forbidden" in got.stderr


def test_kubectl_plugin_forwards_to_podsnap(cluster: Cluster) -> None:
    kubectl = require_tool("kubectl")
    bindir = Path(sys.executable).parent
    assert (bindir / "kubectl-podsnap").exists(), "console script kubectl-podsnap missing: run make setup"
    env = {**os.environ, "PATH": f"{bindir}:{os.environ.get('PATH', '')}", "KUBECONFIG": str(cluster.cp.kubeconfig)}
    got = subprocess.run(
        [kubectl, "podsnap", "status", "policy/web", "-n", NS, "-o", "json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["checkpoint"]["name"] == "web-abc"
    helped = subprocess.run([kubectl, "podsnap", "--help"], capture_output=True, text=True, env=env, check=False)
    assert "usage: kubectl podsnap" in helped.stdout
