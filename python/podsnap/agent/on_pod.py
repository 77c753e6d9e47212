"""Restore the restore pods scheduled on this node into their placeholder containers.

Pod events are level-triggered here: each event of a shaped pod on this node is checked against the pod
condition `podsnap.io/Restored`, which is the only progress record (a pod is the user's object, so the
agent leaves no bookkeeping annotations on it beyond `restored-container-ids`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kopf

from podsnap import contract as c
from podsnap.agent import control, gates, restore_record
from podsnap.agent.artifacts import invalidate
from podsnap.agent.authz import Refused, restore_target
from podsnap.agent.containers import (
    ContainerNotRunning,
    ContainerRef,
    ContainerRefused,
    environ_of,
    find_processes,
    kill_restored,
    ns_pid,
)
from podsnap.agent.executor import ArtifactUnusable, ExecutionError, IncompatibleError, PodRef, RestoreRequest
from podsnap.agent.on_content import artifact_dir
from podsnap.agent.runtime import AgentContext, ctx_of, registry
from podsnap.agent.state_dir import UnsafeStateDir, private_dir
from podsnap.controldir import ControlDir
from podsnap.kube import conditions
from podsnap.kube.conditions import Condition
from podsnap.kube.events import event
from podsnap.kube.podshape import container_of, control_dir_of
from podsnap.kube.reporter import pod_condition, report

log = logging.getLogger(__name__)

TERMINAL_REASONS = (
    c.REASON_RESTORE_SUCCEEDED,
    c.REASON_FELL_BACK_TO_COLD_START,
    c.REASON_RESTORE_FAILED,
    c.REASON_RESTORE_INCOMPATIBLE,
    c.REASON_ALREADY_COLD,
    c.REASON_RESTORE_REFUSED,
    c.REASON_CONTAINER_REFUSED,
)
#: env the new pod's identity is published under in restore-context.json
IDENTITY_KEYS = ("POD_NAME", "POD_NAMESPACE", "POD_UID", "POD_IP", "NODE_NAME", "HOSTNAME")


def set_restored(ctx: AgentContext, pod: Mapping[str, Any], status: bool, reason: str, message: str) -> None:
    pod_condition(ctx.kube, pod)([Condition(c.POD_CONDITION_RESTORED, status, reason, message)])


def restore_context_env(pod: Mapping[str, Any], container_env: Mapping[str, str], node: str) -> dict[str, str]:
    """The new pod's identity plus what the kubelet gave the new container (service links, downward API)."""
    meta, status = pod["metadata"], pod.get("status") or {}
    identity = {
        "POD_NAME": meta["name"],
        "POD_NAMESPACE": meta["namespace"],
        "POD_UID": meta["uid"],
        "POD_IP": status.get("podIP") or "",
        "NODE_NAME": node,
        "HOSTNAME": meta["name"],
    }
    env = {k: v for k, v in container_env.items() if k not in ("PATH", "HOME", "PWD", "SHLVL", "_")}
    env.update(identity)
    return env


def _running_container_id(pod: Mapping[str, Any], container: str) -> str | None:
    for st in (pod.get("status") or {}).get("containerStatuses") or []:
        if st.get("name") == container and "running" in (st.get("state") or {}) and st.get("containerID"):
            return str(st["containerID"])
    return None


@kopf.on.event("v1", "pods", registry=registry)
def pod_restore(*, body: kopf.Body, type: str | None, memo: Any, logger: kopf.Logger, **_: Any) -> None:
    ctx = ctx_of(memo)
    if type == "DELETED":
        uid = str((body.get("metadata") or {}).get("uid"))
        with ctx.lock:
            ctx.started.discard(uid)
        with contextlib.suppress(UnsafeStateDir, OSError):  # a record its restore's verdict did not remove
            restore_record.end(records(ctx), uid)
        return
    pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", **dict(body)}
    meta = pod["metadata"]
    annotations = meta.get("annotations") or {}
    snapshot = annotations.get(c.ANNOTATION_RESTORE_FROM)
    if not snapshot or meta.get("deletionTimestamp") or (pod.get("spec") or {}).get("nodeName") != ctx.config.node_name:
        return
    cond = conditions.find((pod.get("status") or {}).get("conditions"), c.POD_CONDITION_RESTORED)
    reason = None if cond is None else cond.get("reason")
    if reason in TERMINAL_REASONS:
        return
    uid = meta["uid"]
    with ctx.lock:
        if uid in ctx.restoring or uid in ctx.started:
            return  # running now, or done by this process (a late event may still show an older status)
        ctx.restoring.add(uid)
    try:
        container = annotations.get(c.ANNOTATION_RESTORE_CONTAINER) or pod["spec"]["containers"][0]["name"]
        cid = _running_container_id(pod, container)
        recorded = _recorded(ctx, uid)
        if recorded is not None or reason == c.REASON_RESTORE_IN_PROGRESS:
            # an earlier agent died mid-restore; whatever it left is not trusted to serve: the pod starts cold
            abandon(ctx, pod, snapshot=snapshot, container=container, cid=cid, recorded=recorded)
            return
        if cid is None:
            return  # the placeholder is not running yet; a later event brings it
        with ctx.lock:
            ctx.started.add(uid)
        restore(ctx, pod, snapshot=snapshot, container=container, cid=cid, logger=logger)
    finally:
        with ctx.lock:
            ctx.restoring.discard(uid)


def records(ctx: AgentContext) -> Path:
    """This node's restore records (restore_record.py), in the node-local state directory, checked at each
    use like the capture journal's (state_dir.private_dir)."""
    return private_dir(ctx.config.state_dir / restore_record.RESTORING)


def _recorded(ctx: AgentContext, uid: str) -> str | None:
    try:
        return restore_record.interrupted(records(ctx), uid)
    except UnsafeStateDir as exc:
        log.error("%s", exc)
        return None


def container_ref(pod: Mapping[str, Any], cid: str) -> ContainerRef:
    """The container the status names, bound to this pod's UID (ContainerRefused, with the field, when not
    a whole container ID): the status is the user's to write, the UID is not."""
    try:
        return ContainerRef.of(cid, str(pod["metadata"]["uid"]))
    except ContainerRefused as exc:
        raise ContainerRefused(f"status.containerStatuses[].containerID: {exc}") from None


def _control_dir(ctx: AgentContext, pod: Mapping[str, Any], container: str, ref: ContainerRef) -> ControlDir | None:
    """The control dir of the pod's running target container, reached through its root; None when gone."""
    spec = container_of(pod, container)
    if spec is None:
        return None
    try:
        procs = find_processes(ref, ctx.config.proc_root)
    except (ContainerNotRunning, ContainerRefused, OSError):
        return None
    return control.control_dir(procs.root, control_dir_of(spec), ctx.config.proc_root)


def failure_policy(pod: Mapping[str, Any]) -> str:
    """What the pod does when its restore fails (the webhook wrote the effective value; see restore_pod.py)."""
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(c.ANNOTATION_RESTORE_FAILURE_POLICY)
    return value if value in c.RESTORE_FAILURE_POLICIES else c.RESTORE_FAILURE_COLD_START


def _fail(
    ctx: AgentContext,
    pod: Mapping[str, Any],
    cause: str,
    message: str,
    ctl: ControlDir | None,
    *,
    fallback: bool = True,
) -> None:
    """The restore will not happen. The pod learns it through the control dir (its placeholder then starts
    the worker cold, or under restoreFailurePolicy Fail waits). The condition is FellBackToColdStart with
    the cause first in its message (ColdStart), or the cause itself (Fail, or `fallback=False`: a pod
    podsnap did not shape, which nothing here tells to start cold)."""
    line = message.splitlines()[0] if message.strip() else cause
    if fallback and failure_policy(pod) == c.RESTORE_FAILURE_COLD_START:
        cond = Condition(c.POD_CONDITION_RESTORED, False, c.REASON_FELL_BACK_TO_COLD_START, f"{cause}: {line}")
        ctx.metrics.fallbacks.labels(cause).inc()
    elif fallback:
        cond = Condition(
            c.POD_CONDITION_RESTORED, False, cause, f"{line} (restoreFailurePolicy Fail: the pod stays un-Ready)"
        )
    else:
        cond = Condition(c.POD_CONDITION_RESTORED, False, cause, line)
    report(
        pod,
        cond,
        write=pod_condition(ctx.kube, pod),
        warning=True,
        count=ctx.metrics.failures.labels("restore", cause),
    )
    if ctl is not None:
        try:
            ctl.write_file(c.FILE_RESTORE_FAILED, f"{cause}: {line[:300]}\n".encode())
        except OSError as exc:  # the container is gone or broken: its own timeout starts it cold
            log.warning("could not tell %s to start cold: %s", pod["metadata"]["name"], exc)


def abandon(
    ctx: AgentContext,
    pod: Mapping[str, Any],
    *,
    snapshot: str,
    container: str,
    cid: str | None,
    recorded: str | None,
) -> None:
    """A restore an earlier agent process began and never finished: kill whatever it restored into the
    container (a tree CRIU left stopped before its memory was filled, or running without its GPU state),
    then fall back.

    That a restore was interrupted, and into which container, is this node's own record's word
    (`recorded`, restore_record.py), never the pod's status, which its namespace's users may write: a
    `RestoreInProgress` condition without a record kills nothing. And before anything is killed or
    written, the pod must carry podsnap's restore token, and the container must be the pod's own (its
    whole ID, under the pod's cgroup)."""
    uid = str(pod["metadata"]["uid"])
    killed: list[int] = []
    ref: ContainerRef | None = None
    note = ""
    try:
        restore_target(ctx.tokens, pod, snapshot=snapshot, container=container)
        if cid is not None:
            ref = container_ref(pod, cid)
            with contextlib.suppress(ContainerNotRunning):  # refuses another pod's container (ContainerRefused)
                find_processes(ref, ctx.config.proc_root)
        if recorded is None:
            note = "; this node's agent has no record of beginning it, so nothing was killed"
        elif ref is None or ref.container_id != recorded:
            # the container restored into is gone (restarted: its processes went with it), or not the named one
            note = f"; the container it restored into ({recorded[:12]}) is not running, so nothing was killed"
        else:
            killed = kill_restored(ref, ctx.config.proc_root)
    except Refused as exc:
        _fail(ctx, pod, exc.reason, str(exc), None, fallback=False)
        _forget(ctx, uid)
        return
    except ContainerRefused as exc:
        _fail(ctx, pod, c.REASON_CONTAINER_REFUSED, str(exc), None, fallback=False)
        _forget(ctx, uid)
        return
    except OSError as exc:
        log.warning("could not look for what was restored into %s: %s", pod["metadata"]["name"], exc)
    ctl = None if ref is None else _control_dir(ctx, pod, container, ref)
    extra = f"; killed what it had restored (pids {killed})" if killed else note
    _fail(ctx, pod, c.REASON_AGENT_RESTARTED, f"the node agent restarted during the restore{extra}", ctl)
    _forget(ctx, uid)


def _forget(ctx: AgentContext, uid: str) -> None:
    """The restore of pod `uid` has its verdict: drop this node's record of it."""
    try:
        restore_record.end(records(ctx), uid)
    except (UnsafeStateDir, OSError) as exc:
        log.warning("could not remove the restore record of pod %s: %s", uid, exc)


def _claim(ctl: ControlDir) -> bool:
    """Announce the restore; False when the placeholder has already started the worker cold. Each side
    writes its file before it looks for the other's, so they never both go ahead (placeholder.py)."""
    ctl.write_file(c.FILE_RESTORING, b"1\n")
    if ctl.exists(c.FILE_STARTED_COLD):
        ctl.remove(c.FILE_RESTORING)
        return False
    return True


@dataclass(frozen=True)
class BoundArtifact:
    content: str
    path: Path
    digest: str
    #: the content's status.source: the facts of the capture the restore gates compare
    source: Mapping[str, Any] = field(default_factory=dict)


def bound_artifact(ctx: AgentContext, namespace: str, snapshot: str) -> BoundArtifact:
    """The artifact of PodSnapshot `namespace/snapshot`, from its bound PodSnapshotContent only.

    A PodSnapshot's status can be written by its namespace's users, so nothing is read from it but its
    uid. The content (cluster-scoped, made by the operator, its status written by an agent) is found by
    the name derived from that uid, and must name this very snapshot: an artifact serves only the
    namespace that captured it."""
    snap = ctx.kube.get_cr(c.PLURAL_POD_SNAPSHOTS, snapshot, namespace)
    if snap is None:
        raise ExecutionError(f"PodSnapshot {namespace}/{snapshot} does not exist", reason=c.REASON_RESTORE_FAILED)
    uid = snap["metadata"]["uid"]
    name = c.content_name(uid)
    content = ctx.kube.get_cr(c.PLURAL_POD_SNAPSHOT_CONTENTS, name)
    if content is None:
        raise ExecutionError(
            f"PodSnapshot {namespace}/{snapshot} has no PodSnapshotContent {name}: it was never captured",
            reason=c.REASON_RESTORE_FAILED,
        )
    spec, status = content.get("spec") or {}, content.get("status") or {}
    ref = spec.get("podSnapshotRef") or {}
    if (ref.get("namespace"), ref.get("name"), ref.get("uid")) != (namespace, snapshot, uid):
        raise ExecutionError(
            f"refusing {name}: it is bound to PodSnapshot {ref.get('namespace')}/{ref.get('name')} "
            f"(uid {ref.get('uid')}), not to {namespace}/{snapshot} (uid {uid})",
            reason=c.REASON_RESTORE_FAILED,
        )
    if not conditions.is_true(status.get("conditions"), c.COND_READY):
        raise ExecutionError(f"{name} of PodSnapshot {snapshot} is not Ready", reason=c.REASON_RESTORE_FAILED)
    digest = (status.get("artifact") or {}).get("digest")
    if not spec.get("artifactPath") or not digest:
        raise ExecutionError(f"{name} records no artifact path or digest", reason=c.REASON_RESTORE_FAILED)
    path = artifact_dir(ctx.config.artifact_root, spec["artifactPath"])
    return BoundArtifact(name, path, str(digest), dict(status.get("source") or {}))


def restore(
    ctx: AgentContext, pod: Mapping[str, Any], *, snapshot: str, container: str, cid: str, logger: kopf.Logger
) -> None:
    _restore(ctx, pod, snapshot=snapshot, container=container, cid=cid, logger=logger)
    # the verdict is on the pod; when it could not be written (an exception), the record stays and a later
    # agent process abandons the restore, as when this one dies mid-restore
    _forget(ctx, str(pod["metadata"]["uid"]))


def _restore(
    ctx: AgentContext, pod: Mapping[str, Any], *, snapshot: str, container: str, cid: str, logger: kopf.Logger
) -> None:
    meta = pod["metadata"]
    started = time.monotonic()
    ctl: ControlDir | None = None
    artifact: BoundArtifact | None = None
    try:
        # only a pod podsnap's webhook shaped, for this namespace, snapshot and container, before anything
        # touches it; whether the soft gates are skipped is the token's word (the policy's), never the
        # pod author's annotation
        claims = restore_target(ctx.tokens, pod, snapshot=snapshot, container=container)
        spec_container = container_of(pod, container)
        if spec_container is None:
            raise ExecutionError(f"container {container!r} is not in the pod", reason=c.REASON_RESTORE_FAILED)
        ref = container_ref(pod, cid)
        procs = find_processes(ref, ctx.config.proc_root)
        ctl = control.control_dir(procs.root, control_dir_of(spec_container), ctx.config.proc_root)
        artifact = bound_artifact(ctx, meta["namespace"], snapshot)
        skipped = gates.check(pod, container, artifact.source, skip=claims.skip_compat)
        if skipped:
            log.warning(
                "%s/%s: gates %s refused and were skipped (skipCompatCheck)", meta["namespace"], meta["name"], skipped
            )
        container_env = environ_of(procs.root, ctx.config.proc_root)
        if not _claim(ctl):
            message = f"the container started its command cold: no restore began within its {c.ENV_RESTORE_TIMEOUT}"
            _fail(ctx, pod, c.REASON_ALREADY_COLD, message, None)
            return
        try:  # before CRIU runs: a successor of this agent process finds it, whatever the pod's status says
            restore_record.begin(records(ctx), meta["uid"], ref.container_id)
        except UnsafeStateDir as exc:
            raise ExecutionError(str(exc), reason=c.REASON_RESTORE_FAILED) from None
        set_restored(ctx, pod, False, c.REASON_RESTORE_IN_PROGRESS, f"restoring from {snapshot}")
        event(pod, type_="Normal", reason=c.REASON_RESTORE_IN_PROGRESS, message=f"restoring from {snapshot}")
        request = RestoreRequest(
            pod=PodRef(meta["namespace"], meta["name"], meta["uid"], container, cid),
            placeholder_pids=procs.pids,
            placeholder_root_pid=procs.root,
            placeholder_root_start=procs.root_start,
            artifact_dir=artifact.path,
            expected_digest=artifact.digest,
            content=artifact.content,
            skip_compat=claims.skip_compat,
            memory_limit_bytes=gates.memory_limit_of(pod, container),
            node=ctx.config.node_name,
        )
        result = ctx.executor.restore(request)
        worker = result.pids[0] if result.pids else procs.root
        # the placeholder watches this PID: the pod stands or falls with the restored worker
        ctl.write_file(c.FILE_WORKER_PID, f"{ns_pid(worker, ctx.config.proc_root)}\n".encode())
        control.signal_restored(ctl, restore_context_env(pod, container_env, ctx.config.node_name))
    except Refused as exc:
        # nothing is written into a pod podsnap did not shape (its placeholder, if any, times out cold)
        _fail(ctx, pod, exc.reason, str(exc), None, fallback=False)
        return
    except ContainerRefused as exc:
        # the status names a container that is not this pod's: nothing of it is touched, nothing written
        _fail(ctx, pod, c.REASON_CONTAINER_REFUSED, str(exc), None, fallback=False)
        return
    except IncompatibleError as exc:
        _fail(ctx, pod, c.REASON_RESTORE_INCOMPATIBLE, f"gate {exc.gate}: {exc}", ctl)
        return
    except ArtifactUnusable as exc:
        # no later pod may restore from it either: its snapshot stops being Ready and the policy captures again
        content = ctx.kube.get_cr(c.PLURAL_POD_SNAPSHOT_CONTENTS, artifact.content) if artifact else None
        if content is not None:
            invalidate(ctx, content, str(exc))
        _fail(ctx, pod, c.REASON_RESTORE_FAILED, str(exc), ctl)
        return
    except ExecutionError as exc:
        _fail(ctx, pod, exc.reason, str(exc), ctl)
        return
    except (ContainerNotRunning, OSError) as exc:
        _fail(ctx, pod, c.REASON_RESTORE_FAILED, str(exc), ctl)
        return
    except Exception as exc:  # an executor bug must still end in a terminal condition
        _fail(ctx, pod, c.REASON_RESTORE_FAILED, f"{type(exc).__name__}: {exc}", ctl)
        return
    elapsed = time.monotonic() - started
    if result.source == "cache":
        snapshot = f"{snapshot} (node cache)"
    timings = c.format_timings({**result.timings_ms, c.TIMING_AGENT_TOTAL: elapsed * 1000})
    annotations = {c.ANNOTATION_RESTORED_CONTAINER_IDS: cid, c.ANNOTATION_RESTORE_TIMINGS: timings}
    ctx.kube.core.patch_namespaced_pod(meta["name"], meta["namespace"], {"metadata": {"annotations": annotations}})
    set_restored(ctx, pod, True, c.REASON_RESTORE_SUCCEEDED, f"restored from {snapshot} in {elapsed:.2f} s")
    event(
        pod, type_="Normal", reason=c.REASON_RESTORE_SUCCEEDED, message=f"restored from {snapshot} in {elapsed:.2f} s"
    )
    ctx.metrics.restore_seconds.observe(elapsed)
    logger.info("restored %s/%s from %s in %.2f s", meta["namespace"], meta["name"], snapshot, elapsed)
