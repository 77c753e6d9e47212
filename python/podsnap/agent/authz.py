"""What the agent acts on: only pods podsnap made, proven by their tokens (podsnap.kube.tokens).

The agent is privileged on its node: a capture copies a pod's memory and ends its processes, and a
restore puts a worker's memory into a pod. It checks, itself and on every request, that the pod is one
the operator made a capture source (a SnapshotJob's pod) or one the webhook shaped for restore, for
this very namespace, container and snapshot. Nothing a namespace user writes (labels, annotations,
ownerReferences, a PodSnapshot pointing anywhere) can stand in for that proof.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from podsnap import contract as c
from podsnap.agent.executor import ExecutionError
from podsnap.kube.tokens import (
    Claims,
    InvalidToken,
    TokenKey,
    capture_claims,
    not_a_capture_source,
    not_shaped,
    restore_claims,
)


class Refused(ExecutionError):
    """The pod is not one podsnap made for this; `reason` is NotACaptureSource or RestoreRefused."""


def _where(pod: Mapping[str, Any]) -> tuple[str, str]:
    meta = pod.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def capture_source(tokens: TokenKey, pod: Mapping[str, Any], container: str, *, job: str) -> Claims:
    """The capture token of a source pod, made for SnapshotJob `job`, or Refused (NotACaptureSource)."""
    try:
        return capture_claims(tokens, pod, container, job=job)
    except InvalidToken as exc:
        raise Refused(not_a_capture_source(*_where(pod), exc), reason=c.REASON_NOT_A_CAPTURE_SOURCE) from None


def restore_target(tokens: TokenKey, pod: Mapping[str, Any], *, snapshot: str, container: str) -> Claims:
    """The restore token of a restore pod, or Refused (RestoreRefused)."""
    try:
        return restore_claims(tokens, pod, snapshot=snapshot, container=container)
    except InvalidToken as exc:
        raise Refused(not_shaped(*_where(pod), exc), reason=c.REASON_RESTORE_REFUSED) from None
