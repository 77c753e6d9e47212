"""The seccomp profile of a capture pod: podsnap's Localhost profile wherever it weakens nothing.

podsnap's profile is the container runtime's default minus io_uring (CRIU cannot checkpoint io_uring):
as strict as RuntimeDefault, stricter than Unconfined or no profile, so it replaces those. Another
Localhost profile may be stricter and podsnap cannot tell: it stays, and `kept` says where, for the
SnapshotJob's Event. A container's own profile overrides the pod's, so each container is decided too.

A level's profile is its `seccompProfile` field or, on the Kubernetes versions that still read them,
the deprecated seccomp annotation of the pod or container. The API server rejects a pod whose field
and annotation differ, so where podsnap sets the field it removes that level's annotation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

POD_ANNOTATION = "seccomp.security.alpha.kubernetes.io/pod"
CONTAINER_ANNOTATION_PREFIX = "container.seccomp.security.alpha.kubernetes.io/"
_ANNOTATION_TYPES = {
    "runtime/default": "RuntimeDefault",
    "docker/default": "RuntimeDefault",
    "unconfined": "Unconfined",
}


def _from_annotation(value: str) -> dict[str, str]:
    if value.startswith("localhost/"):
        return {"type": "Localhost", "localhostProfile": value.removeprefix("localhost/")}
    return {"type": _ANNOTATION_TYPES.get(value, value)}


def _levels(template: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any], str]]:
    """(where, the object holding `securityContext`, its annotation key), pod first."""
    spec = template.get("spec") or {}
    containers = [
        (f"container {ct.get('name')}", ct, CONTAINER_ANNOTATION_PREFIX + str(ct.get("name")))
        for ct in spec.get("containers") or []
    ]
    return [("pod", spec, POD_ANNOTATION), *containers]


def _profile(template: Mapping[str, Any], obj: Mapping[str, Any], annotation: str) -> dict[str, Any] | None:
    field = (obj.get("securityContext") or {}).get("seccompProfile")
    if field:
        return dict(field)
    value = ((template.get("metadata") or {}).get("annotations") or {}).get(annotation)
    return _from_annotation(value) if value else None


def _replaceable(profile: Mapping[str, Any] | None, ours: str) -> bool:
    if not profile:
        return True
    kind = profile.get("type")
    return kind in ("RuntimeDefault", "Unconfined") or (kind == "Localhost" and profile.get("localhostProfile") == ours)


def kept(template: Mapping[str, Any], ours: str) -> list[str]:
    """Where the template's own profile stays in place of podsnap's (`pod (team/strict.json)`,
    `container main (...)`): there podsnap does not block io_uring."""
    out = []
    for where, obj, annotation in _levels(template):
        profile = _profile(template, obj, annotation)
        if profile is not None and not _replaceable(profile, ours):
            out.append(f"{where} ({profile.get('localhostProfile') or profile.get('type')})")
    return out


def apply(template: dict[str, Any], ours: str) -> None:
    """Put podsnap's profile on the pod, and on each container whose own profile would override it,
    wherever that weakens nothing (mutates `template`, a pod template)."""
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    for index, (_, obj, annotation) in enumerate(_levels(template)):
        profile = _profile(template, obj, annotation)
        if index > 0 and profile is None:
            continue  # the container inherits the pod's
        if _replaceable(profile, ours):
            sc = obj.setdefault("securityContext", {})  # type: ignore[attr-defined]
            sc["seccompProfile"] = {"type": "Localhost", "localhostProfile": ours}
            annotations.pop(annotation, None)
