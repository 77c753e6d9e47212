"""SnapshotJob state machine against the real API server; the test plays the kubelet (no kubelet here)."""

from __future__ import annotations

from typing import Any

from podsnap import contract as c
from tests.operator.conftest import NODE, Env
from tests.operator.harness import cond_is, wait_for


def snapshot_job(name: str, *, containers: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    template = {
        "metadata": {"labels": {"app": "worker"}},
        "spec": {
            "containers": containers
            or [
                {
                    "name": "main",
                    "image": "worker:1",
                    "command": ["python", "-m", "worker"],
                    "livenessProbe": {"httpGet": {"path": "/health", "port": 8000}},
                    "startupProbe": {"httpGet": {"path": "/health", "port": 8000}},
                }
            ]
        },
    }
    return {"kind": c.KIND_SNAPSHOT_JOB, "metadata": {"name": name}, "spec": {"podTemplate": template, **spec}}


def capture_pod(env: Env, ns: str, job: str) -> dict[str, Any]:
    pods = wait_for(lambda: env.cluster.pods(ns, f"{c.LABEL_SNAPSHOT_JOB}={job}"), timeout=30, what="capture pod")
    return pods[0]


def kubelet_starts_capture_pod(env: Env, ns: str, job: str, *, ready: bool = True) -> tuple[dict[str, Any], Any]:
    """The kubelet's part: bind the Job's pod to NODE, run its container, report it Ready."""
    pod = capture_pod(env, ns, job)
    name = pod["metadata"]["name"]
    env.cluster.kubelet_bind(ns, name, NODE)
    proc = env.cluster.kubelet_container()
    env.cluster.kubelet_run(ns, name, ready=ready, container_ids={"main": proc.container_id})
    return pod, proc


def test_capture_job_is_shaped_and_completes_through_the_agent(env: Env, ns: str) -> None:
    """SnapshotJob -> Job (shaped) -> pod Ready (kubelet played) -> PodSnapshot -> content -> agent -> Completed."""
    env.cluster.create(c.PLURAL_SNAPSHOT_JOBS, snapshot_job("cap"), ns)
    sj = wait_for(
        lambda: (
            cond_is(env.cluster.get(c.PLURAL_SNAPSHOT_JOBS, "cap", ns), c.COND_RUNNING, reason=c.REASON_POD_PENDING)
            and env.cluster.get(c.PLURAL_SNAPSHOT_JOBS, "cap", ns)
        ),
        what="Running/PodPending",
    )
    assert sj["status"]["startedAt"]
    job = env.cluster.kube.sanitize(env.cluster.kube.batch.read_namespaced_job("cap", ns))
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["activeDeadlineSeconds"] == 3600
    assert job["metadata"]["ownerReferences"][0]["kind"] == c.KIND_SNAPSHOT_JOB
    tpl = job["spec"]["template"]
    assert tpl["metadata"]["labels"][c.LABEL_SNAPSHOT_JOB] == "cap"
    assert tpl["metadata"]["labels"][c.LABEL_CHECKPOINT_SOURCE] == "true"
    assert tpl["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
    assert tpl["metadata"]["annotations"]["linkerd.io/inject"] == "disabled"
    spec = tpl["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["shareProcessNamespace"] is True
    assert spec["securityContext"]["seccompProfile"] == {
        "type": "Localhost",
        "localhostProfile": "podsnap/checkpoint.json",
    }
    assert {"name": c.CONTROL_VOLUME_NAME, "emptyDir": {}} in spec["volumes"]
    main = spec["containers"][0]
    assert {"name": c.ENV_CONTROL_DIR, "value": c.CONTROL_DIR_DEFAULT} in main["env"]
    assert {"name": c.CONTROL_VOLUME_NAME, "mountPath": c.CONTROL_DIR_DEFAULT} in main["volumeMounts"]
    assert "livenessProbe" not in main and "startupProbe" not in main
    assert main["readinessProbe"]["periodSeconds"] == 1
    assert c.FILE_READY_FOR_SNAPSHOT in " ".join(main["readinessProbe"]["exec"]["command"])

    pod, proc = kubelet_starts_capture_pod(env, ns, "cap")
    sj = wait_for(
        lambda: (
            cond_is(
                got := env.cluster.get(c.PLURAL_SNAPSHOT_JOBS, "cap", ns),
                c.COND_COMPLETED,
                reason=c.REASON_JOB_COMPLETED,
            )
            and got
        ),
        timeout=30,
        what="Completed",
    )
    assert cond_is(sj, c.COND_CAPTURED, reason=c.REASON_CAPTURE_COMPLETED)
    assert cond_is(sj, c.COND_RUNNING, "False")
    assert sj["status"]["podSnapshotName"] == "cap" and sj["status"]["completedAt"]
    snap = env.cluster.get(c.PLURAL_POD_SNAPSHOTS, "cap", ns)
    assert snap is not None and sj["status"]["podSnapshotUID"] == snap["metadata"]["uid"]
    assert cond_is(snap, c.COND_READY)
    assert snap["status"]["artifact"]["sizeBytes"] > 0 and snap["status"]["artifact"]["digest"].startswith("sha256:")
    assert snap["status"]["source"]["node"] == NODE and snap["status"]["source"]["arch"] == "x86_64"
    [call] = env.executor.of("capture", pod["metadata"]["name"], ns)
    assert call.request.root_pid == proc.pid and call.request.pod.container == "main"
    # the checkpoint ended the worker, so the Job goes (and with it the pod)
    wait_for(lambda: not env.cluster.kube.batch.list_namespaced_job(ns).items, what="capture Job deleted")
