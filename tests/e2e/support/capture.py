"""One run of the capture → restore flow, observed closely: deploy the demo worker under a
SnapshotPolicy, watch every pod while the capture runs (did any serving pod start cold? what init id
did the capture source report?), and return what was seen, with the timings of each step."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kubernetes import client as kclient

from podsnap import contract
from tests.e2e.support.config import E2EConfig
from tests.e2e.support.flow import (
    capture_pods,
    demo_deployment,
    demo_service,
    init_id,
    init_ids_in_log,
    pod_start_seconds,
    policy,
    restore_from,
    restored,
    restoring,
    serving_pods,
    snapshot_policy,
    wait_serving,
)
from tests.e2e.support.k8s import Cluster, WaitTimeout, condition, pod_ready


@dataclass
class CaptureRun:
    namespace: str
    app: str
    startup: str
    policy_status: dict[str, Any] = field(default_factory=dict)
    snapshot: dict[str, Any] = field(default_factory=dict)
    job: dict[str, Any] = field(default_factory=dict)
    #: init ids the capture source answered with before it was checkpointed
    source_init_ids: set[str] = field(default_factory=set)
    #: serving pods seen Ready while the capture ran, and whether each was restored
    ready_while_capturing: dict[str, str | None] = field(default_factory=dict)
    serving: list[kclient.V1Pod] = field(default_factory=list)
    #: why the serving pods did not all become Ready (then `serving` holds them as they were)
    serving_error: str = ""
    seconds: dict[str, float] = field(default_factory=dict)

    def require_serving(self) -> list[kclient.V1Pod]:
        """The Ready serving pods; fails the calling test (only) when they never became Ready."""
        assert not self.serving_error, self.serving_error
        return self.serving

    @property
    def checkpoint(self) -> str:
        return str(self.policy_status["checkpointName"])


def _source_init_id(cluster: Cluster, pod: kclient.V1Pod, port: int) -> str | None:
    if pod.status.phase != "Running" or not pod.status.pod_ip:
        return None
    status, body = cluster.proxy(
        f"namespaces/{pod.metadata.namespace}/pods/{pod.metadata.name}:{port}/proxy/health", timeout=2
    )
    if status == 200 and isinstance(body, dict):
        try:
            return init_id(body)
        except AssertionError:
            return None
    return None


def _ts(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


def run_capture(
    cluster: Cluster,
    cfg: E2EConfig,
    namespace: str,
    app: str,
    *,
    startup: str = contract.STARTUP_POLICY_WAIT,
    deletion: str = contract.DELETION_POLICY_DELETE,
    replicas: int = 1,
    serve: bool = True,
) -> CaptureRun:
    """Policy first (so WaitForCheckpoint holds the workload from its first pod), then Service and
    Deployment; returns once the policy is ready and (with `serve`) `replicas` serving pods are Ready."""
    run = CaptureRun(namespace, app, startup)
    t0 = time.monotonic()
    cluster.apply([snapshot_policy(app, app, startup, deletion)], namespace)
    cluster.apply([demo_service(cfg, app), demo_deployment(cfg, app, replicas)], namespace)
    deadline = t0 + cfg.timeout_s
    sources: set[str] = set()
    while True:
        for pod in capture_pods(cluster, namespace):
            seen = _source_init_id(cluster, pod, cfg.demo_port)
            if seen:
                run.source_init_ids.add(seen)
            sources.add(pod.metadata.name)
        for pod in serving_pods(cluster, namespace, app):
            # (a pod Ready a moment before the agent's verdict on its restore is judged by that verdict)
            if pod_ready(pod) and not restoring(pod):
                run.ready_while_capturing.setdefault(pod.metadata.name, restored(pod))
        pol = policy(cluster, namespace, app) or {}
        status = pol.get("status") or {}
        if status.get("ready") is True and status.get("checkpointName"):
            run.policy_status = status
            break
        failed = condition(pol, contract.COND_READY)
        if failed and failed.get("reason") in (contract.REASON_CHECKPOINT_FAILED, contract.REASON_INVALID_SPEC):
            raise AssertionError(f"SnapshotPolicy {namespace}/{app} not ready: {failed}")
        if time.monotonic() > deadline:
            raise WaitTimeout(
                f"timed out after {cfg.timeout_s:.0f} s waiting for SnapshotPolicy {namespace}/{app} ready: {status}"
            )
        time.sleep(0.3)
    run.seconds["policy_ready"] = round(time.monotonic() - t0, 3)
    # the source also printed its init id; its log outlives the checkpointed process
    for name in sources | {p.metadata.name for p in capture_pods(cluster, namespace)}:
        run.source_init_ids |= init_ids_in_log(cluster, namespace, name)
    snapshot = cluster.get_custom(contract.PLURAL_POD_SNAPSHOTS, run.checkpoint, namespace)
    assert snapshot is not None, f"PodSnapshot {run.checkpoint} named by the policy does not exist"
    run.snapshot = snapshot
    job_name = run.policy_status.get("snapshotJobName")
    if job_name:
        run.job = cluster.get_custom(contract.PLURAL_SNAPSHOT_JOBS, str(job_name), namespace) or {}
    started = _ts((run.job.get("status") or {}).get("startedAt"))
    ready_cond = condition(snapshot, contract.COND_READY)
    captured = _ts(ready_cond.get("lastTransitionTime") if ready_cond else None)
    if started and captured:
        run.seconds["capture"] = (captured - started).total_seconds()
    if not serve:
        run.serving = serving_pods(cluster, namespace, app)
        return run
    try:
        run.serving = wait_serving(cluster, namespace, app, replicas, cfg.timeout_s)
    except AssertionError as exc:  # a timeout, or a restore that failed for good
        run.serving = serving_pods(cluster, namespace, app)
        run.serving_error = f"{exc}; restore states: {restored_summary(run.serving)}"
        return run
    for pod in run.serving:
        for key, cond in (("serving_pod_restored", contract.POD_CONDITION_RESTORED), ("serving_pod_ready", "Ready")):
            secs = pod_start_seconds(pod, cond)
            if secs is not None:
                run.seconds[key] = max(secs, run.seconds.get(key, 0.0))
    return run


def restored_summary(pods: list[kclient.V1Pod]) -> dict[str, tuple[str | None, str | None]]:
    return {p.metadata.name: (restored(p), restore_from(p)) for p in pods}
