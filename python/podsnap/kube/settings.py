"""The kopf settings the operator and the agent share (each adds its own finalizer and selectors)."""

from __future__ import annotations

import logging

import kopf


def apply_common(settings: kopf.OperatorSettings, *, finalizer: str, progress_prefix: str) -> None:
    settings.persistence.finalizer = finalizer
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=progress_prefix)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=progress_prefix, key="last-handled-configuration"
    )
    # one replica each (Deployment with Recreate, one agent per node): no peering CRDs
    settings.peering.standalone = True
    # resources are discovered once at start: no watch on CRDs, so no cluster-wide CRD permission needed
    settings.scanning.disabled = True
    # handlers post their own Events with reasons; kopf's log-to-Event mirror would only add noise
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 30
