"""Validating admission of podsnap's objects: the operator acts for a user only where that user could act.

A SnapshotPolicy, SnapshotJob or PodSnapshot makes the operator (and the node agent) do things with
their own, broader rights. Without this check a namespace user who may only create podsnap objects
could scale any Deployment of the namespace, run any pod template (with its ServiceAccount) as a
capture Job, or have any pod's memory copied and its processes ended. So at admission the operator
asks the API server (SubjectAccessReview) whether the requesting user holds, themselves, the rights
the object would exercise, and denies the request naming the first missing one:

  SnapshotPolicy  patch its target Deployment/StatefulSet (the operator scales it and the webhook
                  rewrites its new pods); create jobs and pods (it runs the target's pod template as a
                  capture Job), or get the referenced PodSnapshot (checkpointRef)
  SnapshotJob     create jobs and pods (the capture Job runs the template with its ServiceAccount)
  PodSnapshot     get the pod, create pods/exec on it (a capture copies everything in the pod's
                  memory, as exec could read it) and delete it (the dump ends its processes)

Checked on CREATE and on any UPDATE that changes `spec` (servers without CEL, such as 1.20, let specs
change, and the operator reconciles policies from their current spec). The operator's own requests
(it creates SnapshotJobs for policies and PodSnapshots for SnapshotJobs, and patches finalizers) are
not checked again: the user was checked when the object that caused them was admitted.

The webhook configuration's failurePolicy is Fail for these objects: an unreachable webhook must not
reopen the hole. It only blocks creating podsnap objects while the operator is down, which cannot
progress then anyway; pods and rollouts never wait on it.

The handlers are coroutines, and their access reviews run on a pool of their own: the operator's own
requests come back through this webhook while a handler of the operator waits for them on kopf's
thread pool, so a webhook that needed that pool too could wait for itself (seen as "context deadline
exceeded" when the pool was busy).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Literal

import kopf

from podsnap import contract as c
from podsnap.kube.identity import Requester, username_from_token
from podsnap.operator.access import Right, missing
from podsnap.operator.policy import InvalidPolicy, parse_spec
from podsnap.operator.runtime import OperatorContext, ctx_of, registry

VALIDATE_POLICIES = "validate-snapshotpolicies"
VALIDATE_JOBS = "validate-snapshotjobs"
VALIDATE_SNAPSHOTS = "validate-podsnapshots"

#: why each right is needed, in the denial message
WHY_TARGET = "the operator scales the target and the webhook rewrites its new pods"
WHY_CAPTURE = "the capture Job runs the pod template with its ServiceAccount"
WHY_READ = "a capture copies the pod's memory, everything exec could read"
WHY_END = "the checkpoint ends the pod's processes"


#: the rights an object's spec would exercise in its namespace, each with why
RightsOf = Callable[[Mapping[str, Any] | None, str], list[tuple[Right, str]]]


def _capture_rights(namespace: str) -> list[tuple[Right, str]]:
    return [
        (Right("create", "jobs", "batch", namespace), WHY_CAPTURE),
        (Right("create", "pods", "", namespace), WHY_CAPTURE),
    ]


def policy_rights(spec: Mapping[str, Any] | None, namespace: str) -> list[tuple[Right, str]]:
    try:
        policy = parse_spec(spec)
    except InvalidPolicy:
        return []  # the operator reports it as InvalidSpec and acts on nothing
    resource = "deployments" if policy.kind == "Deployment" else "statefulsets"
    rights = [(Right("patch", resource, "apps", namespace, policy.target), WHY_TARGET)]
    if policy.checkpoint_ref:
        why = "new pods of the target restore from it"
        rights.append((Right("get", c.PLURAL_POD_SNAPSHOTS, c.GROUP, namespace, policy.checkpoint_ref), why))
    else:
        rights += _capture_rights(namespace)
    return rights


def job_rights(spec: Mapping[str, Any] | None, namespace: str) -> list[tuple[Right, str]]:
    return _capture_rights(namespace)


def snapshot_rights(spec: Mapping[str, Any] | None, namespace: str) -> list[tuple[Right, str]]:
    pod = (((spec or {}).get("source") or {}).get("podRef") or {}).get("name")
    if not pod:
        return []  # the operator fails it as InvalidSpec
    return [
        (Right("get", "pods", "", namespace, pod), WHY_READ),
        (Right("create", "pods", "", namespace, pod, "exec"), WHY_READ),
        (Right("delete", "pods", "", namespace, pod), WHY_END),
    ]


def is_self(ctx: OperatorContext, who: Requester) -> bool:
    return bool(who.username) and who.username == username_from_token(ctx.credentials.token)


def check(
    ctx: OperatorContext,
    *,
    kind: str,
    rights_of: RightsOf,
    body: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    operation: str | None,
    userinfo: Mapping[str, Any] | None,
) -> None:
    """Deny (kopf.AdmissionError, 403) unless the requester holds every right the object would use."""
    who = Requester.from_userinfo(userinfo)
    if is_self(ctx, who):
        return
    if operation == "UPDATE" and old is not None and dict(old.get("spec") or {}) == dict(body.get("spec") or {}):
        return  # metadata or status only: nothing new for the operator to do
    namespace = str((body.get("metadata") or {}).get("namespace") or "")
    wanted = rights_of(body.get("spec"), namespace)
    lacking = missing(ctx.kube, who, [right for right, _ in wanted])
    if not lacking:
        return
    why = dict(wanted)
    first = lacking[0]
    more = f" (and {len(lacking) - 1} more: {', '.join(r.describe() for r in lacking[1:])})" if lacking[1:] else ""
    ctx.metrics.admission_denied.labels(kind).inc()
    raise kopf.AdmissionError(
        f"{who.describe()} may not {first.describe()}{more}, which this {kind} needs ({why[first]}); "
        f"podsnap acts for you only where you could act yourself: get that right, or have someone who holds it "
        f"create the {kind}",
        code=403,
    )


#: where access reviews wait for the API server: never kopf's pool for sync handlers (see above)
REVIEWS = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="podsnap-access-review")


def _handler(kind: str, rights_of: RightsOf) -> Callable[..., Coroutine[Any, Any, None]]:
    async def validate(
        *,
        body: kopf.Body,
        old: kopf.Body | None,
        operation: str | None,
        userinfo: Mapping[str, Any],
        memo: Any,
        **_: Any,
    ) -> None:
        ctx = ctx_of(memo)
        if is_self(ctx, Requester.from_userinfo(userinfo)):
            return  # answered at once, on the event loop
        call = functools.partial(
            check, ctx, kind=kind, rights_of=rights_of, body=body, old=old, operation=operation, userinfo=userinfo
        )
        await asyncio.get_running_loop().run_in_executor(REVIEWS, call)

    return validate


OPERATIONS: tuple[Literal["CREATE"], Literal["UPDATE"]] = ("CREATE", "UPDATE")
validate_policy = kopf.on.validate(
    c.GROUP, c.VERSION, c.PLURAL_SNAPSHOT_POLICIES, id=VALIDATE_POLICIES, operations=OPERATIONS, registry=registry
)(_handler(c.KIND_SNAPSHOT_POLICY, policy_rights))
validate_job = kopf.on.validate(
    c.GROUP, c.VERSION, c.PLURAL_SNAPSHOT_JOBS, id=VALIDATE_JOBS, operations=OPERATIONS, registry=registry
)(_handler(c.KIND_SNAPSHOT_JOB, job_rights))
validate_snapshot = kopf.on.validate(
    c.GROUP, c.VERSION, c.PLURAL_POD_SNAPSHOTS, id=VALIDATE_SNAPSHOTS, operations=OPERATIONS, registry=registry
)(_handler(c.KIND_POD_SNAPSHOT, snapshot_rights))
