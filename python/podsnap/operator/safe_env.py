"""The checkpoint-safe environment the pod webhook sets on the target container of capture and restore pods.

What is set, lowest precedence first:
1. the installation's defaults (values.yaml `workload.checkpointEnv.env`, the operator's
   PODSNAP_CHECKPOINT_ENV; without it, `checkpoint_env.COMMON`): collectives on loopback, cuMem and IB
   off, hub downloads off;
2. the engine's own variables, when the pod (template) names its engine in `podsnap.io/engine`;
3. the workload's override, `spec.checkpointEnv` of its SnapshotPolicy (or of a SnapshotJob made by
   hand): `env` sets or replaces variables, `omit` drops defaults, `enabled: false` sets nothing;
4. the container's own `env`: a name the container sets itself is never touched.

A pod (template) annotated `podsnap.io/checkpoint-env: "off"` gets nothing. Restore pods get the same
variables as the capture pod: a restore that falls back to a cold start must build the same process the
checkpoint holds. The checkpoint carries the captured process's environment, so an override changed after
the capture reaches only cold starts until the next capture.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from podsnap import contract as c
from podsnap.kube.tokens import CAPTURE, InvalidToken
from podsnap.operator.runtime import OperatorContext
from podsnap.workload.engines import checkpoint_env

log = logging.getLogger(__name__)


class InvalidOverride(ValueError):
    """A `spec.checkpointEnv` the webhook cannot use; the message names the field."""


@dataclass(frozen=True)
class Override:
    """A workload's `spec.checkpointEnv`."""

    enabled: bool = True
    env: Mapping[str, str] = field(default_factory=dict)
    omit: tuple[str, ...] = ()


def parse_override(raw: Any, where: str) -> Override:
    """`spec.checkpointEnv` of `where` (e.g. "SnapshotPolicy ns/name"); InvalidOverride names the bad field.
    The CRD schema already checks the types; this guards objects written before it had the field."""
    if raw is None:
        return Override()
    if not isinstance(raw, Mapping):
        raise InvalidOverride(f"{where}: spec.checkpointEnv must be an object (enabled, env, omit)")
    enabled = raw.get("enabled", True)
    env = raw.get("env") or {}
    omit = raw.get("omit") or []
    if not isinstance(enabled, bool):
        raise InvalidOverride(f"{where}: spec.checkpointEnv.enabled must be true or false")
    if not isinstance(env, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise InvalidOverride(f"{where}: spec.checkpointEnv.env must map variable names to strings")
    if not isinstance(omit, list) or not all(isinstance(n, str) for n in omit):
        raise InvalidOverride(f"{where}: spec.checkpointEnv.omit must be a list of variable names")
    return Override(enabled, dict(env), tuple(omit))


def override_of(spec: Mapping[str, Any] | None, where: str) -> Override:
    """The override in `spec` (a SnapshotPolicy's or SnapshotJob's); a malformed one is logged and ignored
    (the pod is being created: its workload still gets the defaults)."""
    try:
        return parse_override((spec or {}).get("checkpointEnv"), where)
    except InvalidOverride as exc:
        log.warning("%s; the defaults apply", exc)
        return Override()


def wanted(defaults: Mapping[str, str] | None, pod: Mapping[str, Any], override: Override) -> dict[str, str]:
    """The variables the webhook sets on the target container, under the container's own env. `defaults`
    None: the installation sets none (values.yaml workload.checkpointEnv.enabled false)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if defaults is None or not override.enabled or annotations.get(c.ANNOTATION_CHECKPOINT_ENV) == c.CHECKPOINT_ENV_OFF:
        return {}
    out = dict(defaults)
    engine = annotations.get(checkpoint_env.ANNOTATION_ENGINE)
    if engine in checkpoint_env.ENGINE_ENV:
        out.update({v.name: v.value for v in checkpoint_env.ENGINE_ENV[engine]})
    elif engine:  # an unknown engine must not block the pod: the defaults still apply
        log.warning(
            "checkpoint-safe env: %s=%r is not one of %s; only the defaults are set",
            checkpoint_env.ANNOTATION_ENGINE, engine, ", ".join(checkpoint_env.ENGINES),
        )  # fmt: skip
    for name in override.omit:
        out.pop(name, None)
    out.update(override.env)
    return out


def apply(pod: dict[str, Any], container: str, variables: Mapping[str, str]) -> list[str]:
    """Add `variables` to `container` of `pod` (in place) where the container does not set the name itself
    (`value` or `valueFrom`); the names added."""
    target = next((ct for ct in (pod.get("spec") or {}).get("containers") or [] if ct.get("name") == container), None)
    if target is None or not variables:
        return []
    before = {str(e.get("name")) for e in target.get("env") or []}
    target["env"] = checkpoint_env.merge_env(target.get("env"), variables)
    return [name for name in variables if name not in before]


def capture_pod(
    ctx: OperatorContext, pod: Mapping[str, Any], namespace: str | None, patch: kopf.Patch, logger: kopf.Logger
) -> bool:
    """Set the environment on a capture pod podsnap made (its capture token, from the operator, verifies);
    True when `pod` is one. The override is its SnapshotJob's, else that of the policy that made the job."""
    meta = pod.get("metadata") or {}
    token = (meta.get("annotations") or {}).get(c.ANNOTATION_CAPTURE_TOKEN)
    if not token:
        return False
    try:
        claims = ctx.tokens.verify(token)
    except InvalidToken:
        return False
    # `namespace` is the admission request's: a pod with none is no capture pod of any namespace
    if claims.kind != CAPTURE or not namespace or claims.namespace != namespace:
        return False
    override = capture_override(ctx, claims.namespace, claims.subject)
    containers = copy.deepcopy(list((pod.get("spec") or {}).get("containers") or []))
    added = apply(
        {"spec": {"containers": containers}}, claims.container, wanted(ctx.config.checkpoint_env, pod, override)
    )
    if added:
        patch.spec["containers"] = containers
        logger.info(f"capture pod: checkpoint-safe environment set on {claims.container!r}: {', '.join(added)}")
    return True


def capture_override(ctx: OperatorContext, namespace: str, job: str) -> Override:
    """The override of SnapshotJob `job`: its own spec.checkpointEnv, else that of the policy that made it."""
    snapshot_job = ctx.kube.get_cr(c.PLURAL_SNAPSHOT_JOBS, job, namespace) or {}
    spec = snapshot_job.get("spec") or {}
    if "checkpointEnv" in spec:
        return override_of(spec, f"SnapshotJob {namespace}/{job}")
    policy = ((snapshot_job.get("metadata") or {}).get("labels") or {}).get(c.LABEL_POLICY)
    if not policy:
        return Override()
    found = ctx.kube.get_cr(c.PLURAL_SNAPSHOT_POLICIES, policy, namespace) or {}
    return override_of(found.get("spec"), f"SnapshotPolicy {namespace}/{policy}")
