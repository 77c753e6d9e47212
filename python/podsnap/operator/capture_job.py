"""SnapshotJob -> batch/v1 Job shaped for capture, and the SnapshotJob state machine (pure functions).

Why the Job looks the way it does:
- `backoffLimit: 0`, `restartPolicy: Never`: a capture is one attempt; a retry would warm a second worker.
- `shareProcessNamespace: true`: the pause container becomes PID 1, so the worker's namespace PID is free
  to be taken again inside a restore pod (CRIU restores the same PID there).
- readiness probe on `ready-for-snapshot` every second: pod Ready is the capture gate.
- liveness/startup probes cleared on the target: a quiesced worker must not be restarted by the kubelet.
- sidecar injection off: a mesh proxy's sockets would end up in the checkpoint.
- seccomp: podsnap's Localhost profile (the runtime's default minus io_uring, which CRIU cannot
  checkpoint) wherever it weakens nothing (capture_seccomp.py).
- an init container that uses up the first PIDs of the pod's (shared) PID namespace: CRIU restores the
  worker with its namespace PID, which must be free in the restore pod, where the placeholder and its
  probes take the low PIDs. With this offset the worker's PID is above anything a young restore pod uses.
"""

from __future__ import annotations

import copy
import datetime
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from podsnap import contract as c
from podsnap.kube.conditions import Condition, find, is_true, parse_time
from podsnap.kube.podshape import pod_ready, with_control_dir, with_control_volume
from podsnap.operator import capture_seccomp

DEFAULT_DEADLINE_S = 3600
DEFAULT_TARGET_CONTAINERS = ("main",)
SIDECAR_OFF_ANNOTATIONS = {"sidecar.istio.io/inject": "false", "linkerd.io/inject": "disabled"}
PID_OFFSET = 2000
PID_OFFSET_CONTAINER = "podsnap-pid-offset"
#: forks (no exec) PID_OFFSET short-lived subshells: about a second, and only `sh` is needed in the image
PID_OFFSET_SCRIPT = f"i=0; while [ $i -lt {PID_OFFSET} ]; do (:) & i=$((i+1)); done; wait"


class InvalidSpec(ValueError):
    """A spec the operator refuses; the message names the field and the fix."""


@dataclass(frozen=True)
class CaptureSpec:
    pod_template: dict[str, Any]
    target_container: str
    deadline_s: int


def parse_spec(spec: Mapping[str, Any] | None) -> CaptureSpec:
    spec = spec or {}
    template = spec.get("podTemplate")
    if not isinstance(template, Mapping) or not isinstance(template.get("spec"), Mapping):
        raise InvalidSpec("spec.podTemplate.spec is required: give the pod template of the worker to capture")
    containers = template["spec"].get("containers") or []
    names = [ct.get("name") for ct in containers if isinstance(ct, Mapping)]
    targets = (spec.get("podSnapshotTemplate") or {}).get("targetContainers") or list(DEFAULT_TARGET_CONTAINERS)
    if len(targets) != 1:
        raise InvalidSpec(
            f"spec.podSnapshotTemplate.targetContainers must name exactly one container, got {list(targets)!r}"
        )
    target = targets[0]
    if target not in names:
        raise InvalidSpec(
            f"spec.podSnapshotTemplate.targetContainers: container {target!r} is not in spec.podTemplate "
            f"(containers: {names}); name one of them"
        )
    deadline = spec.get("activeDeadlineSeconds", DEFAULT_DEADLINE_S)
    if not isinstance(deadline, int) or deadline <= 0:
        raise InvalidSpec(f"spec.activeDeadlineSeconds must be a positive integer, got {deadline!r}")
    return CaptureSpec(pod_template=copy.deepcopy(dict(template)), target_container=target, deadline_s=deadline)


def job_name(snapshot_job: str) -> str:
    """The Job is named after its SnapshotJob; long names are cut with a hash so `job-name` labels stay valid."""
    if len(snapshot_job) <= 52:
        return snapshot_job
    return f"{snapshot_job[:43]}-{hashlib.sha256(snapshot_job.encode()).hexdigest()[:8]}"


def build_job(
    *,
    name: str,
    namespace: str,
    uid: str,
    spec: CaptureSpec,
    seccomp_profile: str | None,
    extra_labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    template = copy.deepcopy(spec.pod_template)
    meta = template.setdefault("metadata", {})
    labels = {**(meta.get("labels") or {}), **(extra_labels or {})}
    labels[c.LABEL_SNAPSHOT_JOB] = name
    labels[c.LABEL_CHECKPOINT_SOURCE] = "true"
    meta["labels"] = labels
    meta["annotations"] = {**(meta.get("annotations") or {}), **SIDECAR_OFF_ANNOTATIONS}
    pod = template["spec"]
    pod["restartPolicy"] = "Never"
    pod["shareProcessNamespace"] = True
    if seccomp_profile:
        capture_seccomp.apply(template, seccomp_profile)
    with_control_volume(pod)
    target_image = next(ct.get("image") for ct in pod["containers"] if ct.get("name") == spec.target_container)
    pod["initContainers"] = [
        *(ct for ct in pod.get("initContainers") or [] if ct.get("name") != PID_OFFSET_CONTAINER),
        {"name": PID_OFFSET_CONTAINER, "image": target_image, "command": ["sh", "-c", PID_OFFSET_SCRIPT]},
    ]
    for container in pod["containers"]:
        if container.get("name") != spec.target_container:
            continue
        with_control_dir(container)
        container.pop("livenessProbe", None)
        container.pop("startupProbe", None)
        container["readinessProbe"] = {
            "exec": {"command": ["sh", "-c", f'cat "${{{c.ENV_CONTROL_DIR}}}/{c.FILE_READY_FOR_SNAPSHOT}"']},
            "periodSeconds": 1,
            "failureThreshold": 1,
            "successThreshold": 1,
        }
    job_labels = {c.LABEL_SNAPSHOT_JOB: name, c.LABEL_CHECKPOINT_SOURCE: "true", **(extra_labels or {})}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(name),
            "namespace": namespace,
            "labels": job_labels,
            "ownerReferences": [
                {
                    "apiVersion": c.API_VERSION,
                    "kind": c.KIND_SNAPSHOT_JOB,
                    "name": name,
                    "uid": uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": spec.deadline_s,
            "template": template,
        },
    }


# --- state machine ----------------------------------------------------------------------------


def job_finished(job: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """(condition type, reason) when the Job is Complete or Failed."""
    for cond in (job or {}).get("status", {}).get("conditions") or []:
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return cond["type"], cond.get("reason") or ""
    return None


@dataclass
class Step:
    """What one reconcile of a SnapshotJob decided. The caller applies it."""

    conditions: list[Condition] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    create_snapshot_for: Mapping[str, Any] | None = None
    delete_job: bool = False
    terminal: bool = False
    event: tuple[str, str, str] | None = None  # (type, reason, message)


def _fail(reason: str, message: str, now: str) -> Step:
    return Step(
        conditions=[Condition(c.COND_FAILED, True, reason, message), Condition(c.COND_RUNNING, False, reason, message)],
        status={"completedAt": now},
        delete_job=True,
        terminal=True,
        event=("Warning", reason, message),
    )


def is_terminal(status: Mapping[str, Any] | None) -> bool:
    conds = (status or {}).get("conditions")
    return is_true(conds, c.COND_COMPLETED) or is_true(conds, c.COND_FAILED)


def decide(
    *,
    status: Mapping[str, Any] | None,
    deadline_s: int,
    now: datetime.datetime,
    job: Mapping[str, Any] | None,
    pod: Mapping[str, Any] | None,
    snapshot: Mapping[str, Any] | None,
    job_expected: bool = False,
) -> Step:
    """One reconcile. `job_expected`: the Job was created, so its absence means someone deleted it."""
    status = status or {}
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    if is_terminal(status):
        return Step(terminal=True)
    conds = status.get("conditions")
    snap_conds = (snapshot or {}).get("status", {}).get("conditions")

    if snapshot is not None and is_true(snap_conds, c.COND_READY):
        if job is None or job_finished(job) is not None:
            msg = "the capture is complete and the source Job has finished"
            return Step(
                conditions=[
                    Condition(c.COND_CAPTURED, True, c.REASON_CAPTURE_COMPLETED, "the PodSnapshot is Ready"),
                    Condition(c.COND_COMPLETED, True, c.REASON_JOB_COMPLETED, msg),
                    Condition(c.COND_RUNNING, False, c.REASON_JOB_COMPLETED, msg),
                ],
                status={"completedAt": stamp},
                terminal=True,
                event=("Normal", c.REASON_JOB_COMPLETED, msg),
            )
        # the checkpoint ended the worker; whatever else runs in the source pod only holds resources
        step = Step(
            conditions=[Condition(c.COND_CAPTURED, True, c.REASON_CAPTURE_COMPLETED, "the PodSnapshot is Ready")],
            delete_job=True,
        )
        if not is_true(conds, c.COND_CAPTURED):
            step.event = ("Normal", c.REASON_CAPTURE_COMPLETED, "the PodSnapshot is Ready")
        return step
    if snapshot is not None and is_true(snap_conds, c.COND_FAILED):
        failed = find(snap_conds, c.COND_FAILED) or {}
        return _fail(c.REASON_CAPTURE_FAILED, f"{failed.get('reason')}: {failed.get('message', '')}", stamp)

    started = parse_time(status.get("startedAt"))
    if started is not None and (now - started).total_seconds() >= deadline_s:
        return _fail(c.REASON_DEADLINE_EXCEEDED, f"no capture within activeDeadlineSeconds={deadline_s}", stamp)
    finished = job_finished(job)
    if finished is not None and finished[1] == "DeadlineExceeded":
        return _fail(c.REASON_DEADLINE_EXCEEDED, f"the Job passed activeDeadlineSeconds={deadline_s}", stamp)

    if snapshot is not None:
        step = Step(
            conditions=[Condition(c.COND_RUNNING, True, c.REASON_CAPTURE_IN_PROGRESS, "the node agent is capturing")]
        )
        if status.get("podSnapshotName") != snapshot["metadata"]["name"]:
            step.status = {
                "podSnapshotName": snapshot["metadata"]["name"],
                "podSnapshotUID": snapshot["metadata"]["uid"],
            }
        return step

    if job is None and job_expected:
        return _fail(c.REASON_SOURCE_COMPLETED_WITHOUT_CAPTURE, "the capture Job was deleted before a capture", stamp)
    phase = (pod or {}).get("status", {}).get("phase")
    if finished is not None or phase in ("Succeeded", "Failed"):
        what = f"Job {finished[0]} ({finished[1]})" if finished else f"pod {phase}"
        return _fail(
            c.REASON_SOURCE_COMPLETED_WITHOUT_CAPTURE,
            f"the source finished before it was captured: {what}; the worker must write ready-for-snapshot and wait",
            stamp,
        )
    if pod is not None and pod_ready(pod):
        msg = f"pod {pod['metadata']['name']} is Ready on node {pod['spec']['nodeName']}; capturing"
        return Step(
            conditions=[Condition(c.COND_RUNNING, True, c.REASON_POD_READY, msg)],
            create_snapshot_for=pod,
            event=("Normal", c.REASON_POD_READY, msg),
        )
    msg = "waiting for the source pod to become Ready (ready-for-snapshot)"
    return Step(conditions=[Condition(c.COND_RUNNING, True, c.REASON_POD_PENDING, msg)])
