"""Importing this module registers every operator handler in `runtime.registry`."""

from podsnap.operator import (
    on_agent_requests,
    on_placement,
    on_pod_create,
    on_podsnapshot,
    on_policy,
    on_snapshotjob,
    on_spec_change,
    on_validate,
    orphans,
    startup,
)
from podsnap.operator.runtime import registry

__all__ = [
    "on_agent_requests",
    "on_placement",
    "on_pod_create",
    "on_podsnapshot",
    "on_policy",
    "on_snapshotjob",
    "on_spec_change",
    "on_validate",
    "orphans",
    "registry",
    "startup",
]
