"""Can the cluster under test get podsnap's images? Each must be on a node already (kind loads them) or
in its registry (the local cluster pulls them from localhost:5000, where `make cluster-up` pushed them
with `make images-push`). The registry is asked with skopeo, as `make images-push` pushed."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable

import pykube

from tests.conftest import tool
from tests.e2e.support.config import Images

#: hosts skopeo may reach without TLS (hack/images.sh pushes to them the same way)
PLAIN_HTTP_HOSTS = ("localhost", "127.0.0.1")


def on_nodes(nodes: Iterable[pykube.Node]) -> set[str]:
    """Every image name the nodes report (docker.io names also without their prefix)."""
    names = {n for node in nodes for img in node.obj.get("status", {}).get("images") or [] for n in img["names"] or []}
    return names | {n.removeprefix("docker.io/") for n in names}


def in_registry(ref: str) -> str | None:
    """None when the registry serves `ref`, else why not (one line). Unknown without skopeo: None."""
    skopeo = tool("skopeo")
    if skopeo is None or "/" not in ref:
        return None
    host = ref.split("/", 1)[0]
    tls = ["--tls-verify=false"] if host.split(":")[0] in PLAIN_HTTP_HOSTS else []
    proc = subprocess.run(
        [skopeo, "inspect", "--raw", *tls, f"docker://{ref}"], capture_output=True, text=True, timeout=60, check=False
    )
    if proc.returncode == 0:
        return None
    last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return last[-200:]


def missing_images(images: Images, nodes: Iterable[pykube.Node]) -> str | None:
    """A one-line skip reason naming the first image the cluster cannot get, or None."""
    present = on_nodes(nodes)
    for ref in (images.operator, images.agent, images.demo):
        if ref in present:
            continue
        why = in_registry(ref)
        if why is not None:
            return (
                f"image {ref} is on no node and not in its registry ({why}): run `make cluster-up` "
                "(it pushes them), or `make images images-push REGISTRY=...` for your cluster"
            )
    return None
