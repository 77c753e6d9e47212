"""What podsnap adds to a pod and reads back from it, the same for the operator (which shapes capture
and restore pods) and the agent (which acts on them): the control volume and directory, standby, and
readiness."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from podsnap import contract as c
from podsnap.kube.conditions import is_true


def control_env(control_dir: str = c.CONTROL_DIR_DEFAULT) -> list[dict[str, str]]:
    return [{"name": c.ENV_CONTROL_DIR, "value": control_dir}]


def with_control_dir(container: dict[str, Any]) -> dict[str, Any]:
    """Mount the control volume and set SNAPSHOT_CONTROL_DIR (the container's own value wins if set)."""
    mounts = [m for m in container.get("volumeMounts") or [] if m.get("name") != c.CONTROL_VOLUME_NAME]
    mounts.append({"name": c.CONTROL_VOLUME_NAME, "mountPath": c.CONTROL_DIR_DEFAULT})
    container["volumeMounts"] = mounts
    env = list(container.get("env") or [])
    if not any(e.get("name") == c.ENV_CONTROL_DIR for e in env):
        env.extend(control_env())
    container["env"] = env
    return container


def with_control_volume(pod_spec: dict[str, Any]) -> dict[str, Any]:
    """The per-pod emptyDir behind every target container's control directory."""
    volumes = [v for v in pod_spec.get("volumes") or [] if v.get("name") != c.CONTROL_VOLUME_NAME]
    volumes.append({"name": c.CONTROL_VOLUME_NAME, "emptyDir": {}})
    pod_spec["volumes"] = volumes
    return pod_spec


def control_dir_of(container: Mapping[str, Any]) -> str:
    """The control directory a container's worker uses, as a path inside the container."""
    for e in container.get("env") or []:
        if e.get("name") in (c.ENV_CONTROL_DIR, c.ENV_CONTROL_DIR_DYNAMO) and e.get("value"):
            return str(e["value"])
    return c.CONTROL_DIR_DEFAULT


def is_standby(container: Mapping[str, Any]) -> bool:
    """The container's entrypoint waits for `restore-complete` itself (e.g. `podsnap-run -- <command>`)."""
    return any(
        e.get("name") == c.ENV_RESTORE_STANDBY and c.is_truthy(e.get("value")) for e in container.get("env") or []
    )


def pod_ready(pod: Mapping[str, Any] | None) -> bool:
    """Ready and bound to a node: the capture gate (the readiness probe reads `ready-for-snapshot`)."""
    if pod is None:
        return False
    return is_true((pod.get("status") or {}).get("conditions"), "Ready") and bool(
        (pod.get("spec") or {}).get("nodeName")
    )


def container_of(pod: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    return next((ct for ct in (pod.get("spec") or {}).get("containers") or [] if ct.get("name") == name), None)
