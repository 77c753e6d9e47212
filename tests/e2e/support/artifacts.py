"""The artifact of a PodSnapshot on the artifact volume, reached through the node agent's pod (the one
pod that mounts the volume), so the same code works on every cluster."""

from __future__ import annotations

from typing import Any

from podsnap import contract
from tests.e2e.support.config import E2EConfig
from tests.e2e.support.k8s import Cluster, wait_until

#: the agent's artifact root: the chart mounts the PVC there and passes it in this variable
ROOT = "${PODSNAP_ARTIFACT_ROOT:-/var/lib/podsnap/artifacts}"


def content_of(cluster: Cluster, snapshot: dict[str, Any]) -> dict[str, Any]:
    name = (snapshot.get("status") or {}).get("boundSnapshotContentName") or contract.content_name(
        snapshot["metadata"]["uid"]
    )
    content = cluster.get_custom(contract.PLURAL_POD_SNAPSHOT_CONTENTS, name, None)
    assert content is not None, f"PodSnapshotContent {name} of {snapshot['metadata']['name']} does not exist"
    return content


def agent_pod(cluster: Cluster, cfg: E2EConfig, node: str) -> str:
    ds = cluster.apps.read_namespaced_daemon_set(cfg.agent_daemonset, cfg.release_namespace)
    selector = ",".join(f"{k}={v}" for k, v in (ds.spec.selector.match_labels or {}).items())

    def running() -> str | None:
        pods = cluster.core.list_namespaced_pod(
            cfg.release_namespace, label_selector=selector, field_selector=f"spec.nodeName={node}"
        ).items
        live = [p for p in pods if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]
        return live[0].metadata.name if live else None

    name = wait_until(running, timeout=cfg.timeout_s, what=f"a running agent pod on node {node}")
    return str(name)


def in_artifact(cluster: Cluster, cfg: E2EConfig, content: dict[str, Any], script: str) -> str:
    """Runs a Python `script` in the agent pod of the content's node with ARTIFACT set to its directory."""
    pod = agent_pod(cluster, cfg, content["spec"]["nodeName"])
    sh = f'ARTIFACT="{ROOT}/{content["spec"]["artifactPath"]}" exec python3 -c "$0"'
    out = cluster.kubectl("exec", "-n", cfg.release_namespace, pod, "--", "sh", "-c", sh, script)
    return out.stdout.strip()


def artifact_exists(cluster: Cluster, cfg: E2EConfig, content: dict[str, Any]) -> bool:
    script = "import os; print(os.path.isfile(os.path.join(os.environ['ARTIFACT'], 'manifest.json')))"
    return in_artifact(cluster, cfg, content, script) == "True"


CORRUPT = """
import os
root = os.environ["ARTIFACT"]
files = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f != "manifest.json"]
victim = max(files, key=os.path.getsize)
with open(victim, "r+b") as f:
    f.seek(os.path.getsize(victim) // 2)
    data = f.read(64)
    f.seek(os.path.getsize(victim) // 2)
    f.write(bytes(b ^ 0xFF for b in data) or b"podsnap-e2e")
print(victim)
"""

# a snapshot that claims it was taken on another kernel: what a node with another kernel would see;
# prints the new manifest digest, which record_digest() makes the captured one
OTHER_KERNEL = """
import hashlib, json, os
path = os.path.join(os.environ["ARTIFACT"], "manifest.json")
doc = json.load(open(path))
doc["source"]["kernel"] = "0.0.0-podsnap-e2e-other-kernel"
json.dump(doc, open(path, "w"))
print("sha256:" + hashlib.sha256(open(path, "rb").read()).hexdigest())
"""


def record_digest(cluster: Cluster, content: dict[str, Any], digest: str) -> None:
    """What an agent would have recorded had it captured the artifact as it is now (the cluster admin's
    part: a content's status is not writable by namespace users)."""
    cluster.custom.patch_cluster_custom_object_status(
        contract.GROUP, contract.VERSION, contract.PLURAL_POD_SNAPSHOT_CONTENTS, content["metadata"]["name"],
        {"status": {"artifact": {"digest": digest}}},
    )  # fmt: skip
