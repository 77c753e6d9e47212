"""Shaping a new pod of a SnapshotPolicy for restore (pure; the webhook applies it).

The target container keeps its image but runs the placeholder (placeholder.py) that the node agent
restores the worker next to, and that starts the container's own command cold when the restore fails
or the restored worker dies; unless the container opts into standby (`SNAPSHOT_RESTORE_STANDBY=1`,
e.g. `podsnap-run -- <command>`), whose entrypoint waits for `restore-complete` itself. The startup
probe keeps the pod un-Ready until it is restored or started cold.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from podsnap import contract as c
from podsnap.kube.podshape import is_standby, with_control_dir, with_control_volume
from podsnap.operator import placeholder

#: the startup probe allows this long for the agent to restore (periodSeconds 1 x failureThreshold)
RESTORE_STARTUP_BUDGET_S = 900


class NotShapeable(ValueError):
    """The pod cannot be shaped for restore (the webhook then leaves it untouched: a cold start)."""


def shape(pod: Mapping[str, Any], *, snapshot: str, container: str) -> dict[str, Any]:
    """The restore-shaped copy of `pod` (metadata and spec); raises NotShapeable naming the problem."""
    shaped = copy.deepcopy(dict(pod))
    spec = shaped.setdefault("spec", {})
    containers = spec.get("containers") or []
    target = next((ct for ct in containers if ct.get("name") == container), None)
    if target is None:
        names = [ct.get("name") for ct in containers]
        raise NotShapeable(f"container {container!r} not in the pod (containers: {names}); fix targetContainerName")
    standby = is_standby(target)
    if not standby and not target.get("command"):
        raise NotShapeable(
            f"container {container!r} has no command, so it could not start cold if its restore failed "
            "(the image's entrypoint is not in the pod spec); give it an explicit command"
        )
    meta = shaped.setdefault("metadata", {})
    meta["annotations"] = {
        **(meta.get("annotations") or {}),
        c.ANNOTATION_RESTORE_FROM: snapshot,
        c.ANNOTATION_RESTORE_CONTAINER: container,
    }
    meta["labels"] = {**(meta.get("labels") or {}), c.LABEL_RESTORE: "true"}
    spec["shareProcessNamespace"] = True
    with_control_volume(spec)
    with_control_dir(target)
    if not standby:
        target["command"] = placeholder.command([*target["command"], *(target.get("args") or [])])
        target.pop("args", None)
    # a restored worker is alive from the first second; liveness starts counting only after the startup probe
    target["startupProbe"] = {
        "exec": {"command": ["sh", "-c", placeholder.STARTUP_PROBE_SCRIPT]},
        "periodSeconds": 1,
        "failureThreshold": RESTORE_STARTUP_BUDGET_S,
    }
    return shaped
