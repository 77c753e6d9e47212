"""The artifact of a PodSnapshot on the artifact volume, reached through the node agent's pod (the one
pod that mounts the volume), so the same code works on every cluster."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
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
    return damage_everywhere(cluster, cfg, content, "corrupt")


#: what damage_everywhere() can do to an artifact
DAMAGES = ("corrupt", "truncate", "delete")


def damage_everywhere(cluster: Cluster, cfg: E2EConfig, content: dict[str, Any], how: str) -> str:
    """Damages the artifact on the volume and, the same way, every copy the node-local cache holds of it
    (waiting first for the prefetch or first restore to have made one, when the agent has a cache), so a
    restore has no good copy left to read: `corrupt` flips bytes in the middle of its largest file,
    `truncate` cuts that file to half its size, `delete` removes the whole artifact directory (in the
    cache: the entry's copy of it)."""
    assert how in DAMAGES, how
    pod = agent_pod(cluster, cfg, content["spec"]["nodeName"])
    sh = (
        f'ARTIFACT="{ROOT}/{content["spec"]["artifactPath"]}" CONTENT="{content["metadata"]["name"]}" '
        f'CACHE="${{{contract.ENV_CACHE_DIR}:-}}" PREFETCH="${{{contract.ENV_PREFETCH_CONCURRENCY}:-1}}" '
        f'TIMEOUT="{cfg.timeout_s}" HOW="{how}" exec python3 -c "$0"'
    )
    out = cluster.kubectl("exec", "-n", cfg.release_namespace, pod, "--", "sh", "-c", sh, DAMAGE_EVERYWHERE)
    return out.stdout.strip()


def artifact_exists(cluster: Cluster, cfg: E2EConfig, content: dict[str, Any]) -> bool:
    script = "import os; print(os.path.isfile(os.path.join(os.environ['ARTIFACT'], 'manifest.json')))"
    return in_artifact(cluster, cfg, content, script) == "True"


DAMAGE_EVERYWHERE = """
import glob, os, shutil, time
def flip(path):
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(size // 2)
        data = f.read(64)
        f.seek(size // 2)
        f.write(bytes(b ^ 0xFF for b in data) or b"podsnap-e2e")
def truncate(path):
    os.truncate(path, os.path.getsize(path) // 2)
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
    copies = [d for d in glob.glob(pattern) if os.path.isfile(os.path.join(d, rel))]
how = os.environ["HOW"]
for artifact in [root, *copies]:
    if how == "delete":
        shutil.rmtree(artifact)
    else:
        (flip if how == "corrupt" else truncate)(os.path.join(artifact, rel))
print(how, victim, len(copies))
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


def leftovers(cluster: Cluster, cfg: E2EConfig, node: str, namespace: str) -> list[str]:
    """What the artifact volume holds under `namespace`'s directory (through the agent pod of `node`),
    relative to the artifact root: every file and directory below it (artifacts, capture staging dirs
    `.NAME.staging-*`, artifacts renamed aside for deletion `.NAME.deleting-*`, empty dirs). Empty once
    everything of the namespace has been deleted. The namespace's directory itself is not listed: an empty
    one is kept a while for captures about to stage in it, and the agents remove it later."""
    pod = agent_pod(cluster, cfg, node)
    sh = f'ROOT="{ROOT}" NS="{namespace}" exec python3 -c "$0"'
    out = cluster.kubectl("exec", "-n", cfg.release_namespace, pod, "--", "sh", "-c", sh, LEFTOVERS)
    return list(json.loads(out.stdout))


LEFTOVERS = """
import json, os
root = os.environ["ROOT"]
found = []
for d, dirs, files in os.walk(os.path.join(root, os.environ["NS"])):
    rel = os.path.relpath(d, root)
    found += [os.path.join(rel, n) + "/" for n in dirs] + [os.path.join(rel, n) for n in files]
print(json.dumps(sorted(found)))
"""


def agent_pods(cluster: Cluster, cfg: E2EConfig) -> list[str]:
    """The running agent pods, one per node the DaemonSet runs on."""
    ds = cluster.apps.read_namespaced_daemon_set(cfg.agent_daemonset, cfg.release_namespace)
    selector = ",".join(f"{k}={v}" for k, v in (ds.spec.selector.match_labels or {}).items())
    pods = cluster.core.list_namespaced_pod(cfg.release_namespace, label_selector=selector).items
    return [p.metadata.name for p in pods if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]


#: the size of the filesystem volume_full() puts where a namespace's artifacts go: far less than any
#: worker's resident memory
FULL_SIZE = "1m"


@contextmanager
def volume_full(cluster: Cluster, cfg: E2EConfig, namespace: str) -> Iterator[list[str]]:
    """The artifact volume is full, as every agent sees it, where `namespace`'s artifacts go; undone on exit.

    The volume itself is shared (on the local cluster a hostPath on the node's root filesystem, with
    etcd, containerd and everything else; hack/cluster/storage.yaml), so it is not filled: each agent
    gets a 1 MiB tmpfs mounted over the namespace's directory in its own mount namespace (the agent runs
    privileged). The agent then finds that little room free where the capture would write; nothing
    else on the node sees the mount, and unmounting it (or a restart of the agent's container) undoes
    it. Yields what `df` said in each agent."""
    target = f"{ROOT}/{namespace}"
    mount = f'mkdir -p "{target}" && mount -t tmpfs -o size={FULL_SIZE},mode=0755 podsnap-e2e-full "{target}"'
    pods = agent_pods(cluster, cfg)
    assert pods, "no running agent pod"
    seen: list[str] = []
    mounted: list[str] = []
    try:
        for pod in pods:
            out = cluster.kubectl(
                "exec", "-n", cfg.release_namespace, pod, "--", "sh", "-c", f'{mount} && df -k "{target}" | tail -1'
            )
            mounted.append(pod)
            seen.append(f"{pod}: {out.stdout.strip()}")
        yield seen
    finally:
        for pod in mounted:
            # the container may have restarted since (its mount is gone then); the directory is left empty
            cluster.kubectl(
                "exec", "-n", cfg.release_namespace, pod, "--", "sh", "-c",
                f'umount "{target}"; rmdir "{target}" 2>/dev/null; true', check=False,
            )  # fmt: skip
