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

from tests.support.harness import Cluster

VALIDATING = "podsnap-webhook"


def _admission(cluster: Cluster) -> Any:
    return kubernetes.client.AdmissionregistrationV1Api(cluster.kube.client)


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
    try:
        yield
    finally:
        api.patch_validating_webhook_configuration(VALIDATING, {"webhooks": before["webhooks"]})
