"""Capture the PodSnapshotContents bound to this node; remove their artifacts when they go."""

from __future__ import annotations

import datetime
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

import kopf

from podsnap import contract as c
from podsnap.agent import gates
from podsnap.agent.authz import capture_source
from podsnap.agent.containers import ContainerNotRunning, ContainerRef, ContainerRefused, find_processes
from podsnap.agent.executor import CaptureRequest, ExecutionError, PodRef
from podsnap.agent.runtime import AgentContext, ctx_of, registry
from podsnap.agent.volume_sweep import remove_leftovers
from podsnap.kube import conditions
from podsnap.kube.client import get_or_none
from podsnap.kube.conditions import Condition, now_rfc3339, parse_time
from podsnap.kube.events import event
from podsnap.kube.podshape import pod_ready
from podsnap.kube.reporter import cr_status, report

CONTENTS = (c.GROUP, c.VERSION, c.PLURAL_POD_SNAPSHOT_CONTENTS)


def terminal(status: Mapping[str, Any] | None) -> bool:
    conds = (status or {}).get("conditions")
    return conditions.is_true(conds, c.COND_READY) or conditions.is_true(conds, c.COND_FAILED)


def artifact_dir(root: Path, rel: str) -> Path:
    """The artifact directory of a content, refusing paths that would leave the artifact root."""
    base = root.resolve()
    target = (base / rel).resolve()
    if base not in target.parents:
        raise ExecutionError(f"spec.artifactPath {rel!r} leaves the artifact root", reason=c.REASON_INVALID_SPEC)
    return target


def _set(ctx: AgentContext, name: str, *updates: Condition, **fields: Any) -> None:
    cr_status(ctx.kube, c.PLURAL_POD_SNAPSHOT_CONTENTS, name, **fields)(updates)


def _mine(labels: Mapping[str, str], memo: Any, **_: Any) -> bool:
    # the label selector already filters server-side; this guards a misconfigured watch
    return labels.get(c.LABEL_SNAPSHOT_NODE) == ctx_of(memo).config.node_name


@kopf.on.create(*CONTENTS, registry=registry, when=_mine)
@kopf.on.resume(*CONTENTS, registry=registry, when=_mine)
def content_capture(
    *,
    name: str,
    spec: kopf.Spec,
    status: kopf.Status,
    meta: kopf.Meta,
    body: kopf.Body,
    memo: Any,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    ctx = ctx_of(memo)
    if terminal(status) or meta.get("deletionTimestamp"):
        return
    created = parse_time(meta.get("creationTimestamp"))
    if created is not None:
        ctx.metrics.pickup_seconds.observe(max(0.0, (datetime.datetime.now(datetime.UTC) - created).total_seconds()))
    if conditions.reason_of(status.get("conditions"), c.COND_READY) == c.REASON_CAPTURE_IN_PROGRESS:
        # an earlier agent died mid-capture before its journal said more (agent/capture_recovery.py fails
        # the contents whose journal it found): the source may be gone, and a half artifact is not trusted
        fail(
            ctx,
            body,
            c.REASON_AGENT_RESTARTED,
            "the node agent restarted during the capture; capture again (a SnapshotPolicy does, with backoff)",
        )
    try:
        request = _request(ctx, name, spec)
    except ExecutionError as exc:
        fail(ctx, body, exc.reason, str(exc))
    _set(ctx, name, Condition(c.COND_READY, False, c.REASON_CAPTURE_IN_PROGRESS, f"capturing pid {request.root_pid}"))
    message = f"capturing {request.pod.namespace}/{request.pod.name} on {ctx.config.node_name}"
    ref = spec.get("podSnapshotRef") or {}
    snapshot = {
        "apiVersion": c.API_VERSION,
        "kind": c.KIND_POD_SNAPSHOT,
        "metadata": {k: ref[k] for k in ("name", "namespace", "uid") if k in ref},
    }
    # on the snapshot users watch, and on the content (cluster-scoped: its Events land in `default`, so they
    # name no namespace)
    public = f"capturing on {ctx.config.node_name}"
    for obj in (body, snapshot):
        event(obj, type_="Normal", reason=c.REASON_CAPTURE_IN_PROGRESS, message=message, public=public)
    logger.info(
        "capturing %s/%s (pids %s) into %s", request.pod.namespace, request.pod.name, request.pids, request.artifact_dir
    )
    started = time.monotonic()
    try:
        result = ctx.executor.capture(request)
    except ExecutionError as exc:
        fail(ctx, body, exc.reason, str(exc))
    except Exception as exc:  # the executor's own bug must still end the content, not leave it pending
        fail(ctx, body, c.REASON_CAPTURE_FAILED, f"{type(exc).__name__}: {exc}")
    elapsed = time.monotonic() - started
    ctx.metrics.capture_seconds.observe(elapsed)
    ctx.metrics.capture_bytes.observe(result.size_bytes)
    _set(
        ctx,
        name,
        Condition(c.COND_READY, True, c.REASON_CAPTURE_COMPLETED, f"captured in {elapsed:.1f} s"),
        Condition(c.COND_FAILED, False, c.REASON_CAPTURE_COMPLETED, "captured"),
        # the artifact's directory is the content's spec.artifactPath: one place, written once by the operator
        artifact={"sizeBytes": result.size_bytes, "digest": result.digest},
        source={"node": ctx.config.node_name, **result.source, **request.source_facts},
        capturedAt=now_rfc3339(),
        captureTimingsMs=capture_timings(result.timings_ms, elapsed),
    )
    done = f"{result.size_bytes} bytes in {elapsed:.1f} s"
    event(body, type_="Normal", reason=c.REASON_CAPTURE_COMPLETED, message=done, public=done)


def capture_timings(engine_ms: Mapping[str, float], elapsed_s: float) -> dict[str, float]:
    """status.captureTimingsMs: the engine's phases and the agent's own wall time, at 0.1 ms."""
    timings = {**engine_ms, c.TIMING_AGENT_TOTAL: elapsed_s * 1000}
    return {k: round(float(v), 1) for k, v in timings.items()}


def _request(ctx: AgentContext, name: str, spec: Mapping[str, Any]) -> CaptureRequest:
    ref = (spec.get("source") or {}).get("podRef") or {}
    container = (ref.get("containers") or ["main"])[0]
    pod_obj = get_or_none(ctx.kube.core.read_namespaced_pod, ref.get("name"), ref.get("namespace"))
    if pod_obj is None:
        raise ExecutionError(
            f"source pod {ref.get('namespace')}/{ref.get('name')} is gone", reason=c.REASON_POD_NOT_FOUND
        )
    pod = ctx.kube.sanitize(pod_obj)
    if ref.get("uid") and pod["metadata"]["uid"] != ref["uid"]:
        raise ExecutionError(
            f"pod {ref.get('name')} was re-created (uid {pod['metadata']['uid']}, expected {ref['uid']})",
            reason=c.REASON_POD_UID_MISMATCH,
        )
    if pod["spec"].get("nodeName") != ctx.config.node_name:
        raise ExecutionError(
            f"pod runs on {pod['spec'].get('nodeName')}, not on {ctx.config.node_name}", reason=c.REASON_POD_NOT_FOUND
        )
    # only a pod the operator made a capture source (a SnapshotJob's), for this namespace, container and job
    capture_source(ctx.tokens, pod, container, job=str((spec.get("podSnapshotRef") or {}).get("name") or ""))
    if not pod_ready(pod):
        raise kopf.TemporaryError("the source pod is not Ready (no ready-for-snapshot yet)", delay=1)
    statuses = {s["name"]: s for s in (pod.get("status") or {}).get("containerStatuses") or []}
    cid = (statuses.get(container) or {}).get("containerID")
    if not cid:
        raise ExecutionError(
            f"container {container!r} has no containerID in the pod status", reason=c.REASON_CONTAINER_NOT_FOUND
        )
    try:
        # the status names the container, and its namespace's users may write it: the ID must be whole and
        # its processes under this very pod's cgroup, or another container's tree would be dumped
        procs = find_processes(ContainerRef.of(str(cid), pod["metadata"]["uid"]), ctx.config.proc_root)
    except ContainerRefused as exc:
        raise ExecutionError(
            f"container {container!r} (status.containerStatuses[].containerID): {exc}",
            reason=c.REASON_CONTAINER_REFUSED,
        ) from None
    except ContainerNotRunning as exc:
        raise ExecutionError(str(exc), reason=c.REASON_CONTAINER_NOT_FOUND) from exc
    dest = artifact_dir(ctx.config.artifact_root, spec.get("artifactPath") or name)
    check_room(dest, resident_bytes(procs.pids, ctx.config.proc_root))
    return CaptureRequest(
        pod=PodRef(ref["namespace"], ref["name"], pod["metadata"]["uid"], container, cid),
        pids=procs.pids,
        root_pid=procs.root,
        root_start=procs.root_start,
        artifact_dir=dest,
        node=ctx.config.node_name,
        source_facts=gates.source_facts(pod, container),
        content=name,
    )


def resident_bytes(pids: tuple[int, ...], proc_root: Path = Path("/proc")) -> int:
    """The resident memory of the tree: what its artifact holds at least (a CUDA checkpoint adds the GPU
    memory's host copy on top)."""
    total = 0
    for pid in pids:
        try:
            for line in (proc_root / str(pid) / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            continue
    return total


def _size(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def check_room(dest: Path, need: int) -> None:
    """Refuse a capture, before anything touches the source, when the artifact volume has not the room for
    what the capture will write at least: it would fill the volume and fail after the dump."""
    where = dest
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free
    if need > free:
        raise ExecutionError(
            f"the artifact volume has {_size(free)} free and this capture needs at least {_size(need)} "
            "(the source's resident memory); the source was not touched and keeps running. Free space on the "
            "volume or enlarge it (storage.size), then capture again",
            reason=c.REASON_STORAGE_FULL,
        )


def fail(ctx: AgentContext, body: Mapping[str, Any], reason: str, message: str) -> NoReturn:
    report(
        body,
        Condition(c.COND_FAILED, True, reason, message),
        Condition(c.COND_READY, False, reason, message),
        write=cr_status(ctx.kube, c.PLURAL_POD_SNAPSHOT_CONTENTS, body["metadata"]["name"]),
        warning=True,
        count=ctx.metrics.failures.labels("capture", reason),
    )
    raise kopf.PermanentError(message)


@kopf.on.delete(*CONTENTS, registry=registry, when=_mine)
def content_cleanup(*, name: str, spec: kopf.Spec, memo: Any, logger: kopf.Logger, **_: Any) -> None:
    ctx = ctx_of(memo)
    if spec.get("deletionPolicy", c.DELETION_POLICY_DELETE) != c.DELETION_POLICY_DELETE:
        return
    try:
        target = artifact_dir(ctx.config.artifact_root, spec.get("artifactPath") or name)
    except ExecutionError as exc:
        logger.warning("not removing an artifact outside the root: %s", exc)
        return
    if target.exists():
        ctx.executor.remove(target)
        logger.info("removed artifact %s", target)
    # a content being deleted is captured into no more (kopf runs one handler of an object at a time), and
    # one handed over from another node (operator/orphans.py) may have what its dead agent left half done
    for leftover in remove_leftovers(ctx.config.artifact_root, target):
        logger.info("removed %s, left next to the artifact of %s", leftover, name)
