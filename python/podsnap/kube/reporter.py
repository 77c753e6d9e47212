"""One call for what every outcome of a podsnap step does: set the object's conditions, post an Event
with the same reason and message, and count it in a metric.

Where the conditions go depends on who holds the object: a kopf handler of the object itself patches
through kopf (`kopf_patch`), anyone else writes the status subresource (`cr_status`, `pod_condition`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import kopf

from podsnap.kube import conditions
from podsnap.kube.client import Kube
from podsnap.kube.conditions import Condition
from podsnap.kube.events import event

#: writes a set of conditions onto the object being reported on
ConditionWriter = Callable[[Sequence[Condition]], None]


class Counter(Protocol):
    def inc(self, amount: float = 1) -> None: ...


def kopf_patch(patch: kopf.Patch, **fields: Any) -> ConditionWriter:
    """Conditions (and status `fields`) through the handler's own kopf patch, replayed on conflicts."""

    def write(updates: Sequence[Condition]) -> None:
        for key, value in fields.items():
            patch.status[key] = value
        patch.fns.append(conditions.patch_fn(*updates))

    return write


def cr_status(kube: Kube, plural: str, name: str, namespace: str | None = None, **fields: Any) -> ConditionWriter:
    """Conditions (and status `fields`) of a podsnap object, written through its status subresource."""

    def write(updates: Sequence[Condition]) -> None:
        def mutate(obj: dict[str, Any]) -> bool:
            status = obj["status"]
            status.update(fields)
            status["conditions"] = conditions.merged(status.get("conditions"), list(updates))
            return True

        kube.update_cr_status(plural, name, namespace, mutate)

    return write


def pod_condition(kube: Kube, pod: Mapping[str, Any]) -> ConditionWriter:
    """Pod conditions through pods/status; a strategic merge keyed by type leaves the kubelet's alone."""
    meta = pod["metadata"]

    def write(updates: Sequence[Condition]) -> None:
        stamp = conditions.now_rfc3339()
        body = [
            {
                "type": u.type,
                "status": conditions.TRUE if u.status else conditions.FALSE,
                "reason": u.reason,
                "message": conditions.short(u.message) or u.reason,
                "lastTransitionTime": stamp,
            }
            for u in updates
        ]
        kube.core.patch_namespaced_pod_status(
            meta["name"], meta["namespace"], {"status": {"conditions": body}},
            _content_type="application/strategic-merge-patch+json",
        )  # fmt: skip

    return write


def report(
    obj: Mapping[str, Any],
    *updates: Condition,
    write: ConditionWriter,
    warning: bool = False,
    count: Counter | None = None,
    public: str | None = None,
) -> None:
    """Set `updates` on `obj`, post an Event with the first update's reason and message, bump `count`.
    `public`: the Event's message when `obj` is cluster-scoped (podsnap.kube.events)."""
    if not updates:
        raise ValueError("report() needs at least one condition")
    write(updates)
    first = updates[0]
    message = first.message or first.reason
    event(obj, type_="Warning" if warning else "Normal", reason=first.reason, message=message, public=public)
    if count is not None:
        count.inc()
