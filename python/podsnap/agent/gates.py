"""The compatibility gates that need the pods, not the host: the image the worker ran and its memory limit.

A restored worker keeps its memory but runs on the restore container's root filesystem, so the two must
come from the same image: the capture records the source container's image ID (its digest, from the
pod status the kubelet writes) on the PodSnapshotContent, and a restore container whose image resolved
to another digest is refused (gate `image-digest`). A worker restored under a lower memory limit would
be OOM-killed at the first touch of its pages: the capture records the source container's limit, and a
restore container with a lower one is refused (gate `memory-limit`; the engine's own `memory-limit` gate
compares the same restore limit with the memory actually dumped).

Both are soft gates: the restore token's skip flag (a SnapshotPolicy's skipCompatCheck) passes them,
as it passes the engine's. A content captured before these facts were recorded has nothing to compare
and passes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from kubernetes.utils import parse_quantity

from podsnap.agent.executor import IncompatibleError
from podsnap.kube.podshape import container_of

#: the facts a content's status.source carries for these gates
IMAGE_ID = "imageID"
MEMORY_LIMIT = "memoryLimitBytes"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def image_id_of(pod: Mapping[str, Any], container: str) -> str:
    """The container's image ID as the kubelet reports it (e.g. `docker.io/library/x@sha256:...`); "" if not yet."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container:
            return str(status.get("imageID") or "")
    return ""


def digest_of(image_id: str) -> str:
    """The content digest in an image ID (runtimes spell the rest differently); the whole ID if it has none."""
    found = _DIGEST.search(image_id)
    return found.group(0) if found else image_id


def memory_limit_of(pod: Mapping[str, Any], container: str) -> int | None:
    """The container's memory limit in bytes; None when it has none."""
    spec = container_of(pod, container) or {}
    limit = ((spec.get("resources") or {}).get("limits") or {}).get("memory")
    return None if limit in (None, "") else int(parse_quantity(str(limit)))


def source_facts(pod: Mapping[str, Any], container: str) -> dict[str, Any]:
    """What a capture records for these gates (status.source of the content and the PodSnapshot)."""
    facts: dict[str, Any] = {}
    if image := image_id_of(pod, container):
        facts[IMAGE_ID] = image
    if (limit := memory_limit_of(pod, container)) is not None:
        facts[MEMORY_LIMIT] = limit
    return facts


def check(pod: Mapping[str, Any], container: str, source: Mapping[str, Any], *, skip: bool) -> list[str]:
    """Raise IncompatibleError for the first gate that refuses the restore pod; with `skip`, return the
    gates that would have refused instead."""
    refusals: list[IncompatibleError] = []
    want_image = str(source.get(IMAGE_ID) or "")
    if want_image:
        have_image = image_id_of(pod, container)
        if digest_of(have_image) != digest_of(want_image):
            refusals.append(
                IncompatibleError(
                    "image-digest",
                    f"the checkpoint was taken from image {want_image}, container {container!r} runs "
                    f"{have_image or 'an image whose ID is not reported'}; pin the image by digest so new pods "
                    "run the captured one, or let the policy capture the new image",
                )
            )
    want_limit = source.get(MEMORY_LIMIT)
    if isinstance(want_limit, int):
        have_limit = memory_limit_of(pod, container)
        if have_limit is not None and have_limit < want_limit:
            refusals.append(
                IncompatibleError(
                    "memory-limit",
                    f"container {container!r} has a memory limit of {have_limit} bytes, the source had {want_limit}: "
                    "the restored worker would be OOM-killed; give the restore pod at least the source's limit",
                )
            )
    if refusals and not skip:
        raise refusals[0]
    return [r.gate for r in refusals]
