"""Kubernetes Events about podsnap's objects and the pods it acts on."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, cast

import kopf

from podsnap.kube.conditions import short

log = logging.getLogger(__name__)

#: the API server keeps at most 1 KiB of an Event's message; podsnap's are a sentence or two anyway
EVENT_MESSAGE_MAX = 1024


def event(obj: Mapping[str, Any], *, type_: str, reason: str, message: str) -> None:
    """A Kubernetes Event on `obj` (a body with apiVersion/kind/metadata); never fails the caller."""
    try:
        kopf.event(cast(kopf.Body, dict(obj)), type=type_, reason=reason, message=short(message, EVENT_MESSAGE_MAX))
    except Exception:  # an Event is best-effort by nature
        log.exception("could not post event %s on %s", reason, (obj.get("metadata") or {}).get("name"))
