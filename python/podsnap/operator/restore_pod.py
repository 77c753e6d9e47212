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
from dataclasses import dataclass
from typing import Any

from podsnap import contract as c
from podsnap.kube.podshape import is_standby, with_control_dir, with_control_volume
from podsnap.operator import placeholder

#: the startup probe allows the pickup timeout and the restore timeout plus this long (periodSeconds 1)
STARTUP_MARGIN_S = 60


@dataclass(frozen=True)
class Timeouts:
    """What a restore pod's target container is given (the chart's restore.* values; the container's own
    env wins): how long to wait for the agent to begin, and how long a begun restore may take."""

    pickup_s: int = c.RESTORE_TIMEOUT_DEFAULT_S
    restore_s: int = c.RESTORE_MAX_DEFAULT_S


class NotShapeable(ValueError):
    """The pod cannot be shaped for restore (the webhook then leaves it untouched: a cold start)."""


def failure_policy(pod: Mapping[str, Any], policy_default: str) -> str:
    """The pod's own podsnap.io/restore-failure-policy when it names one, else its SnapshotPolicy's."""
    own = ((pod.get("metadata") or {}).get("annotations") or {}).get(c.ANNOTATION_RESTORE_FAILURE_POLICY)
    return own if own in c.RESTORE_FAILURE_POLICIES else policy_default


def _env(container: dict[str, Any], values: Mapping[str, str], forced: Mapping[str, str]) -> int:
    """Add `values` the container does not set itself, and `forced` in place of its own; returns the seconds
    its env then gives the restore (pickup + restore timeouts), which size the startup probe."""
    env = [e for e in container.get("env") or [] if e.get("name") not in forced]
    have = {e.get("name"): e.get("value") for e in env}
    env.extend({"name": k, "value": v} for k, v in values.items() if k not in have)
    env.extend({"name": k, "value": v} for k, v in forced.items())
    container["env"] = env
    merged = {**values, **{k: v for k, v in have.items() if v is not None}}
    budget = 0
    for name in (c.ENV_RESTORE_TIMEOUT, c.ENV_RESTORE_MAX):
        try:
            budget += max(0, int(str(merged.get(name))))
        except ValueError:  # the placeholder falls back to its default for a value it cannot read
            budget += c.RESTORE_MAX_DEFAULT_S
    return budget


def shape(
    pod: Mapping[str, Any],
    *,
    snapshot: str,
    container: str,
    on_failure: str = c.RESTORE_FAILURE_COLD_START,
    timeouts: Timeouts = Timeouts(),
) -> dict[str, Any]:
    """The restore-shaped copy of `pod` (metadata and spec); raises NotShapeable naming the problem.
    `on_failure` is the effective restore failure policy (see `failure_policy`)."""
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
        c.ANNOTATION_RESTORE_FAILURE_POLICY: on_failure,
    }
    meta["labels"] = {**(meta.get("labels") or {}), c.LABEL_RESTORE: "true"}
    spec["shareProcessNamespace"] = True
    with_control_volume(spec)
    with_control_dir(target)
    budget = _env(
        target,
        {c.ENV_RESTORE_TIMEOUT: str(timeouts.pickup_s), c.ENV_RESTORE_MAX: str(timeouts.restore_s)},
        {c.ENV_RESTORE_FAILURE_POLICY: on_failure},
    )
    if not standby:
        target["command"] = placeholder.command([*target["command"], *(target.get("args") or [])])
        target.pop("args", None)
    # a restored worker is alive from the first second; liveness starts counting only after the startup probe
    target["startupProbe"] = {
        "exec": {"command": ["sh", "-c", placeholder.STARTUP_PROBE_SCRIPT]},
        "periodSeconds": 1,
        "failureThreshold": budget + STARTUP_MARGIN_S,
    }
    return shaped
