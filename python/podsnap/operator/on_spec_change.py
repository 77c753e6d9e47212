"""Specs are immutable (DESIGN.md). Servers with CEL reject edits (`self == oldSelf` in the CRDs); older ones
(Kubernetes 1.20 ignores x-kubernetes-validations) accept them, so the operator says so on the object and
keeps working from what it already created."""

from __future__ import annotations

from typing import Any

import kopf

from podsnap import contract as c
from podsnap.kube.events import event
from podsnap.operator.runtime import registry

REASON_SPEC_IMMUTABLE = "SpecImmutable"


@kopf.on.update(c.GROUP, c.VERSION, c.PLURAL_SNAPSHOT_JOBS, field="spec", registry=registry)
@kopf.on.update(c.GROUP, c.VERSION, c.PLURAL_POD_SNAPSHOTS, field="spec", registry=registry)
@kopf.on.update(c.GROUP, c.VERSION, c.PLURAL_SNAPSHOT_POLICIES, field="spec", registry=registry)
def spec_changed(*, body: kopf.Body, **_: Any) -> None:
    kind = body.get("kind", "object")
    message = f"{kind} spec is immutable and the change is ignored; delete and re-create the {kind} to change it"
    event(body, type_="Warning", reason=REASON_SPEC_IMMUTABLE, message=message)
    raise kopf.PermanentError(message)
