"""Kubernetes Events about podsnap's objects and the pods it acts on.

An Event of a cluster-scoped object (a PodSnapshotContent) is published in the `default` namespace,
which many clusters let every user read. So such an Event never carries the message its caller wrote,
which may name another namespace, its pods and snapshots: only `public`, a text its caller vouches
for, or else the reason and where the details are (the object's status, readable only by those who may
read the object)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, cast

import kopf

from podsnap.kube.conditions import now_rfc3339, short

log = logging.getLogger(__name__)

#: the API server keeps at most 1 KiB of an Event's message; podsnap's are a sentence or two anyway
EVENT_MESSAGE_MAX = 1024


def event(obj: Mapping[str, Any], *, type_: str, reason: str, message: str, public: str | None = None) -> None:
    """A Kubernetes Event on `obj` (a body with apiVersion/kind/metadata); never fails the caller. For a
    cluster-scoped object the message is `public`, or a pointer to the object's status."""
    if not (obj.get("metadata") or {}).get("namespace"):
        message = public or f"{reason}: see the {obj.get('kind') or 'object'}'s status for the details"
    try:
        kopf.event(cast(kopf.Body, dict(obj)), type=type_, reason=reason, message=short(message, EVENT_MESSAGE_MAX))
    except Exception:  # an Event is best-effort by nature
        log.exception("could not post event %s on %s", reason, (obj.get("metadata") or {}).get("name"))


def cluster_event(core: Any, obj: Mapping[str, Any], *, type_: str, reason: str, message: str) -> None:
    """An Event on cluster-scoped `obj` (a body with apiVersion/kind/metadata), in `default`, so `message` must
    name no namespace; posted through the API (`core`: a CoreV1Api), for loops that run outside kopf's
    handlers, where kopf.event has no queue. Never fails the caller."""
    meta = obj.get("metadata") or {}
    now = now_rfc3339()
    ev = {
        "metadata": {"generateName": f"{meta.get('name')}.", "namespace": "default"},
        "involvedObject": {
            "apiVersion": obj.get("apiVersion"),
            "kind": obj.get("kind"),
            "name": meta.get("name"),
            "uid": meta.get("uid"),
        },
        "type": type_,
        "reason": reason,
        "message": short(message, EVENT_MESSAGE_MAX),
        "source": {"component": "podsnap-operator"},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        core.create_namespaced_event("default", ev)
    except Exception as exc:  # an Event is best-effort by nature
        log.warning("could not post event %s on %s: %s", reason, meta.get("name"), exc)
