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


def corrupt_everywhere(cluster: Cluster, cfg: E2EConfig, content: dict[str, Any]) -> str:
    """Flips bytes of the artifact's largest file on the volume AND in every copy the node-local cache
    holds of it (waiting first for the prefetch or first restore to have made one, when the agent has a
    cache): a sealed cache entry, written to, must be dropped, so the restore reads the corrupt volume."""
    pod = agent_pod(cluster, cfg, content["spec"]["nodeName"])
    sh = (
        f'ARTIFACT="{ROOT}/{content["spec"]["artifactPath"]}" CONTENT="{content["metadata"]["name"]}" '
        f'CACHE="${{{contract.ENV_CACHE_DIR}:-}}" PREFETCH="${{{contract.ENV_PREFETCH_CONCURRENCY}:-1}}" '
        f'TIMEOUT="{cfg.timeout_s}" exec python3 -c "$0"'
    )
    out = cluster.kubectl("exec", "-n", cfg.release_namespace, pod, "--", "sh", "-c", sh, CORRUPT_EVERYWHERE)
    return out.stdout.strip()


def artifact_exists(cluster: Cluster, cfg: E2EConfig, content: dict[str, Any]) -> bool:
    script = "import os; print(os.path.isfile(os.path.join(os.environ['ARTIFACT'], 'manifest.json')))"
    return in_artifact(cluster, cfg, content, script) == "True"


CORRUPT_EVERYWHERE = """
import glob, os, time
def flip(path):
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(size // 2)
        data = f.read(64)
        f.seek(size // 2)
        f.write(bytes(b ^ 0xFF for b in data) or b"podsnap-e2e")
root = os.environ["ARTIFACT"]
files = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f != "manifest.json"]
victim = max(files, key=os.path.getsize)
rel = os.path.relpath(victim, root)
copies = []
if os.environ["CACHE"] and os.environ["PREFETCH"] != "0":
    pattern = os.path.join(os.environ["CACHE"], "entries", os.environ["CONTENT"] + "@*", "artifact")
    deadline = time.monotonic() + float(os.environ["TIMEOUT"])
    while not glob.glob(pattern) and time.monotonic() < deadline:
        time.sleep(0.2)
    copies = [os.path.join(d, rel) for d in glob.glob(pattern) if os.path.isfile(os.path.join(d, rel))]
for path in [victim, *copies]:
    flip(path)
print(victim, len(copies))
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
