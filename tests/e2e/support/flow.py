"""The user's flow, as building blocks: the demo worker, its Service and SnapshotPolicy, and the
observations the tests make (restore conditions, the worker's identity, a chat completion).

Names come from `podsnap.contract`, so a protocol rename is one edit.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as kclient
from kubernetes.client.exceptions import ApiException

from podsnap import contract
from tests.e2e.support.config import E2EConfig
from tests.e2e.support.k8s import Cluster, Pending, condition, pod_condition, pod_ready, wait_until

CONTAINER = "main"
#: a pod whose restore ended so did not restore (it falls back to a cold start, or holds under Fail)
TERMINAL_RESTORE_FAILURES = (
    contract.REASON_FELL_BACK_TO_COLD_START,
    contract.REASON_RESTORE_FAILED,
    contract.REASON_RESTORE_INCOMPATIBLE,
)


# --- manifests -----------------------------------------------------------------------------------
def demo_deployment(cfg: E2EConfig, name: str, replicas: int = 1, memory: str = "1Gi") -> dict[str, Any]:
    """The demo worker (an OpenAI-compatible server instrumented with podsnap's SDK) as a Deployment."""
    resources: dict[str, Any] = {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": memory}}
    if cfg.gpu:
        resources["limits"]["nvidia.com/gpu"] = 1
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "terminationGracePeriodSeconds": 2,
                    "containers": [
                        {
                            "name": CONTAINER,
                            "image": cfg.demo_image,
                            "imagePullPolicy": "IfNotPresent",
                            "command": ["podsnap-run", "--", "python", "-m", "podsnap.demo"],
                            "args": ["--port", str(cfg.demo_port), "--device", "cuda" if cfg.gpu else "cpu"],
                            "ports": [{"name": "http", "containerPort": cfg.demo_port}],
                            "readinessProbe": {
                                "httpGet": {"path": "/health", "port": cfg.demo_port},
                                "periodSeconds": 1,
                                "failureThreshold": 600,
                            },
                            "resources": resources,
                        }
                    ],
                },
            },
        },
    }


def demo_service(cfg: E2EConfig, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": {"app": name}, "ports": [{"name": "http", "port": 80, "targetPort": cfg.demo_port}]},
    }


def snapshot_policy(
    name: str, target: str, startup: str = contract.STARTUP_POLICY_WAIT, deletion: str = contract.DELETION_POLICY_DELETE
) -> dict[str, Any]:
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND_SNAPSHOT_POLICY,
        "metadata": {"name": name},
        "spec": {
            "targetRef": {"kind": "Deployment", "name": target},
            "startupPolicy": startup,
            "deletionPolicy": deletion,
            "targetContainerName": CONTAINER,
        },
    }


# --- observations --------------------------------------------------------------------------------
def serving_pods(cluster: Cluster, namespace: str, app: str) -> list[kclient.V1Pod]:
    """The Deployment's pods (capture pods of a SnapshotJob carry the job label and are left out)."""
    pods = cluster.core.list_namespaced_pod(namespace, label_selector=f"app={app},!{contract.LABEL_SNAPSHOT_JOB}").items
    return [p for p in pods if p.metadata.deletion_timestamp is None]


def capture_pods(cluster: Cluster, namespace: str) -> list[kclient.V1Pod]:
    return list(cluster.core.list_namespaced_pod(namespace, label_selector=contract.LABEL_SNAPSHOT_JOB).items)


def restored(pod: kclient.V1Pod) -> str | None:
    """The pod's `podsnap.io/Restored` condition as "Status/Reason" (None when absent)."""
    cond = pod_condition(pod, contract.POD_CONDITION_RESTORED)
    return f"{cond.status}/{cond.reason}" if cond else None


def restore_from(pod: kclient.V1Pod) -> str | None:
    return (pod.metadata.annotations or {}).get(contract.ANNOTATION_RESTORE_FROM)


def policy(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    return cluster.get_custom(contract.PLURAL_SNAPSHOT_POLICIES, name, namespace)


def wait_policy_ready(cluster: Cluster, namespace: str, name: str, timeout: float) -> dict[str, Any]:
    def ready() -> dict[str, Any] | Pending | None:
        obj = policy(cluster, namespace, name)
        status = (obj or {}).get("status") or {}
        if status.get("ready") is True and status.get("checkpointName"):
            return status
        failed = [c for c in status.get("conditions") or [] if c.get("status") == "True" and c.get("type") == "Failed"]
        if failed:
            raise AssertionError(f"SnapshotPolicy {name} failed: {failed}")
        return Pending(status) if obj else None

    return wait_until(ready, timeout=timeout, what=f"SnapshotPolicy {namespace}/{name} status.ready=true")


def worker_health(cluster: Cluster, namespace: str, pod: str, port: int) -> dict[str, Any]:
    status, body = cluster.proxy(f"namespaces/{namespace}/pods/{pod}:{port}/proxy/health")
    assert status == 200 and isinstance(body, dict), f"GET /health of pod {pod}: {status} {body}"
    return body


INIT_ID_IN_LOG = re.compile(r"init_id=([0-9a-f-]{36})")


def init_ids_in_log(cluster: Cluster, namespace: str, pod: str) -> set[str]:
    """The init ids a demo worker printed (`podsnap-demo: serving on ... init_id=...`)."""
    try:
        log = cluster.core.read_namespaced_pod_log(pod, namespace, container=CONTAINER)
    except ApiException:
        return set()
    return set(INIT_ID_IN_LOG.findall(log))


def init_id(body: dict[str, Any]) -> str:
    """The demo worker's initialization id: minted once at init, so a restored process keeps its source's."""
    for where in (body, body.get("podsnap") or {}):
        if isinstance(where, dict) and isinstance(where.get("init_id"), str):
            return str(where["init_id"])
    raise AssertionError(f"the demo worker's answer carries no init id: {body}")


def chat(cluster: Cluster, namespace: str, service: str, prompt: str = "hello") -> dict[str, Any]:
    """A chat completion through the Service (the API server's service proxy picks a ready endpoint)."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 8}
    status, answer = cluster.proxy(
        f"namespaces/{namespace}/services/{service}:80/proxy/v1/chat/completions", method="POST", body=body, timeout=60
    )
    assert status == 200 and isinstance(answer, dict), (
        f"POST /v1/chat/completions via Service {service}: {status} {answer}"
    )
    choices = answer.get("choices") or []
    assert choices and (choices[0].get("message") or {}).get("content"), f"no completion in {answer}"
    return answer


def run_python_pod(
    cluster: Cluster, cfg: E2EConfig, namespace: str, name: str, *, script: str, security: dict[str, Any] | None = None
) -> tuple[str, str]:
    """Run `script` with the demo image's python in a pod of its own (pod `securityContext` `security`) to
    its end; (its phase, or the runtime's CreateContainerError, and its log)."""
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "probe",
                "image": cfg.demo_image,
                "imagePullPolicy": "IfNotPresent",
                "command": ["python", "-c", script],
            }
        ],
    }
    if security:
        spec["securityContext"] = security
    cluster.apply([{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}], namespace)

    def finished() -> str | None:
        status = cluster.core.read_namespaced_pod(name, namespace).status
        waiting = [s.state.waiting for s in status.container_statuses or [] if s.state and s.state.waiting]
        if waiting and waiting[0].reason == "CreateContainerError":
            return f"CreateContainerError: {waiting[0].message}"
        return status.phase if status.phase in ("Succeeded", "Failed") else None

    phase = wait_until(finished, timeout=cfg.timeout_s, what=f"pod {name} to finish")
    try:
        log = cluster.core.read_namespaced_pod_log(name, namespace)
    except ApiException as exc:  # a container that never started has no log
        log = f"(no log: {exc.reason})"
    return str(phase), str(log)


def restoring(pod: kclient.V1Pod) -> bool:
    """Has the agent begun restoring into the pod and not yet said how it ended?"""
    cond = pod_condition(pod, contract.POD_CONDITION_RESTORED)
    return cond is not None and cond.reason == contract.REASON_RESTORE_IN_PROGRESS


def wait_serving(cluster: Cluster, namespace: str, app: str, count: int, timeout: float) -> list[kclient.V1Pod]:
    def ready() -> list[kclient.V1Pod] | Pending:
        pods = serving_pods(cluster, namespace, app)
        for p in pods:
            # a refused or failed restore is terminal: that pod never serves, no need to wait it out
            cond = pod_condition(p, contract.POD_CONDITION_RESTORED)
            if cond and cond.status == "False" and cond.reason in TERMINAL_RESTORE_FAILURES:
                raise AssertionError(f"pod {p.metadata.name}: {cond.reason}: {cond.message}")
        # Ready while the agent's verdict is still to come: the restored worker answers the kubelet's probe
        # as soon as it runs, a moment before the agent's condition write lands; wait for the verdict
        good = [p for p in pods if pod_ready(p) and not restoring(p)]
        if len(good) >= count:
            return good
        return Pending(f"{len(good)}/{count} ready: {[(p.metadata.name, p.status.phase) for p in pods]}")

    return wait_until(ready, timeout=timeout, what=f"{count} ready pod(s) of {namespace}/{app}")


def condition_time(obj: dict[str, Any] | None, type_: str) -> str | None:
    cond = condition(obj, type_)
    return str(cond.get("lastTransitionTime")) if cond else None


# --- timings ---------------------------------------------------------------------------------------
@dataclass
class Timings:
    """Wall times of the flow's steps, written as JSON under out/ at the end of the session."""

    values: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def measure(self, key: str) -> Iterator[None]:
        t0 = time.monotonic()
        yield
        self.values[key] = round(time.monotonic() - t0, 3)


def pod_start_seconds(pod: kclient.V1Pod, until_condition: str = "Ready") -> float | None:
    """Seconds from the pod's creation to `until_condition` turning True (the API's own timestamps)."""
    cond = pod_condition(pod, until_condition)
    if cond is None or cond.status != "True" or cond.last_transition_time is None:
        return None
    return float((cond.last_transition_time - pod.metadata.creation_timestamp).total_seconds())
