"""The test control plane's webhook configurations (the chart's, with 127.0.0.1 URLs): pointing the
validating one at another operator process for a while, e.g. one a test starts in the session operator's
place, since that webhook fails closed."""

from __future__ import annotations

import base64
import copy
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import kubernetes

from podsnap import contract as c
from tests.support.harness import Cluster
from tests.support.waiting import wait_for

VALIDATING = "podsnap-webhook"


def _admission(cluster: Cluster) -> Any:
    return kubernetes.client.AdmissionregistrationV1Api(cluster.kube.client)


def _calls(cluster: Cluster, base_url: str) -> bool:
    """Whether a dry-run PodSnapshot (validated, never stored) is answered by, or fails calling, `base_url`."""
    body = {
        "apiVersion": c.API_VERSION,
        "kind": c.KIND_POD_SNAPSHOT,
        "metadata": {"name": "webhook-probe"},
        "spec": {"source": {"podRef": {"name": "probe", "containers": ["main"]}}},
    }
    try:
        cluster.kube.custom.create_namespaced_custom_object(
            c.GROUP, c.VERSION, "default", c.PLURAL_POD_SNAPSHOTS, body, dry_run="All"
        )
    except kubernetes.client.ApiException as exc:
        if exc.status is not None and exc.status >= 500:
            return base_url.rstrip("/") in str(exc.body)  # else the old configuration's URL failed
        raise
    return True


@contextmanager
def validating_served_by(cluster: Cluster, base_url: str, ca_file: Path) -> Iterator[None]:
    """Every validating hook calls `base_url` + its own last path segment, trusting only `ca_file`."""
    api = _admission(cluster)
    before = cluster.kube.sanitize(api.read_validating_webhook_configuration(VALIDATING))
    hooks = copy.deepcopy(before["webhooks"])
    for hook in hooks:
        last = hook["clientConfig"]["url"].rsplit("/", 1)[-1]
        hook["clientConfig"] = {
            "url": f"{base_url.rstrip('/')}/{last}",
            "caBundle": base64.b64encode(ca_file.read_bytes()).decode(),
        }
    api.patch_validating_webhook_configuration(VALIDATING, {"webhooks": hooks})
    # the API server reads webhook configurations through a watch: wait until it calls the new URL
    wait_for(lambda: _calls(cluster, base_url), what=f"the API server calling the validating webhook at {base_url}")
    try:
        yield
    finally:
        api.patch_validating_webhook_configuration(VALIDATING, {"webhooks": before["webhooks"]})
