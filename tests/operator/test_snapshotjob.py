"""SnapshotJob state machine against the real API server; the test plays the kubelet (no kubelet here)."""

from __future__ import annotations

from typing import Any

from podsnap import contract as c
from podsnap.agent.executor import ExecutionError
from tests.support.harness import cond_is, condition
from tests.support.operator_env import NODE, Env, capture_pod, kubelet_starts_capture_pod, snapshot_job
from tests.support.waiting import wait_for


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
    [offset] = spec["initContainers"]
    assert offset["image"] == "worker:1" and offset["command"][0] == "sh", (
        "the worker's PID must be above a restore pod's"
    )
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


def get_sj(env: Env, ns: str, name: str = "cap") -> dict[str, Any] | None:
    return env.cluster.get(c.PLURAL_SNAPSHOT_JOBS, name, ns)


def failed(env: Env, ns: str, reason: str, timeout: float = 20) -> dict[str, Any]:
    return wait_for(
        lambda: cond_is(s := get_sj(env, ns), c.COND_FAILED, reason=reason) and s,
        timeout=timeout,
        what=f"Failed/{reason}",
    )


def test_target_container_missing_from_the_template_is_invalid_spec(env: Env, ns: str) -> None:
    env.cluster.create(
        c.PLURAL_SNAPSHOT_JOBS, snapshot_job("cap", podSnapshotTemplate={"targetContainers": ["gpu-worker"]}), ns
    )
    sj = failed(env, ns, c.REASON_INVALID_SPEC)
    assert "'gpu-worker' is not in spec.podTemplate" in condition(sj, c.COND_FAILED)["message"]  # type: ignore[index]
    assert cond_is(sj, c.COND_RUNNING, "False") and sj["status"]["completedAt"]
    assert not env.cluster.kube.batch.list_namespaced_job(ns).items, "no Job for an invalid spec"
    wait_for(
        lambda: [e for e in env.cluster.kube.core.list_namespaced_event(ns).items if e.reason == c.REASON_INVALID_SPEC],
        what="InvalidSpec Event",
    )


def test_deadline_exceeded_when_the_pod_never_becomes_ready(env: Env, ns: str) -> None:
    env.cluster.create(c.PLURAL_SNAPSHOT_JOBS, snapshot_job("cap", activeDeadlineSeconds=2), ns)
    kubelet_starts_capture_pod(env, ns, "cap", ready=False)
    sj = failed(env, ns, c.REASON_DEADLINE_EXCEEDED)
    assert not cond_is(sj, c.COND_CAPTURED)
    assert env.cluster.get(c.PLURAL_POD_SNAPSHOTS, "cap", ns) is None
    wait_for(lambda: not env.cluster.kube.batch.list_namespaced_job(ns).items, what="Job deleted at the deadline")


def test_source_that_exits_before_capture_fails_the_job(env: Env, ns: str) -> None:
    """The kubelet reports the worker's pod Succeeded without it ever writing ready-for-snapshot."""
    pod = capture_pod(env, ns, "cap") if env.cluster.create(c.PLURAL_SNAPSHOT_JOBS, snapshot_job("cap"), ns) else None
    assert pod is not None
    env.cluster.kubelet_bind(ns, pod["metadata"]["name"], NODE)
    env.cluster.kubelet_run(ns, pod["metadata"]["name"], ready=False, phase="Succeeded")
    sj = failed(env, ns, c.REASON_SOURCE_COMPLETED_WITHOUT_CAPTURE)
    assert "ready-for-snapshot" in condition(sj, c.COND_FAILED)["message"]  # type: ignore[index]


def test_capture_failure_fails_the_job_with_capture_failed(env: Env, ns: str) -> None:
    env.cluster.create(c.PLURAL_SNAPSHOT_JOBS, snapshot_job("cap"), ns)
    pod = capture_pod(env, ns, "cap")
    name = pod["metadata"]["name"]
    env.executor.fail_capture[name] = ExecutionError("cuCheckpointProcessLock: CUDA_ERROR_NOT_READY")
    try:
        kubelet_starts_capture_pod(env, ns, "cap")
        sj = failed(env, ns, c.REASON_CAPTURE_FAILED)
    finally:
        env.executor.fail_capture.pop(name)
    assert "CUDA_ERROR_NOT_READY" in condition(sj, c.COND_FAILED)["message"]  # type: ignore[index]
    snap = env.cluster.get(c.PLURAL_POD_SNAPSHOTS, "cap", ns)
    assert cond_is(snap, c.COND_FAILED, reason=c.REASON_CAPTURE_FAILED)
    assert not cond_is(snap, c.COND_READY)


def test_every_step_leaves_an_event_and_metrics_count_it(env: Env, ns: str) -> None:
    from prometheus_client import generate_latest

    env.cluster.create(c.PLURAL_SNAPSHOT_JOBS, snapshot_job("cap"), ns)
    kubelet_starts_capture_pod(env, ns, "cap")
    wait_for(lambda: cond_is(get_sj(env, ns), c.COND_COMPLETED), timeout=30, what="Completed")
    wanted = {
        "JobCreated",
        c.REASON_POD_READY,
        "PodSnapshotCreated",
        "Bound",
        c.REASON_CAPTURE_IN_PROGRESS,
        c.REASON_CAPTURE_COMPLETED,
        c.REASON_JOB_COMPLETED,
    }
    try:
        wait_for(
            lambda: wanted <= {e.reason for e in env.cluster.kube.core.list_namespaced_event(ns).items}, what="Events"
        )
    except AssertionError:
        got = {e.reason for e in env.cluster.kube.core.list_namespaced_event(ns).items}
        raise AssertionError(f"missing Events {sorted(wanted - got)}; got {sorted(got)}") from None
    operator_metrics = generate_latest(env.operator_ctx.metrics.registry).decode()
    agent_metrics = generate_latest(env.agent_ctx.metrics.registry).decode()
    assert "podsnap_operator_capture_duration_seconds_count" in operator_metrics
    count = next(
        line for line in agent_metrics.splitlines() if line.startswith("podsnap_agent_capture_duration_seconds_count")
    )
    assert float(count.split()[-1]) >= 1
    assert "podsnap_agent_pickup_seconds_bucket" in agent_metrics


def test_spec_edits_are_refused_with_an_event(env: Env, ns: str) -> None:
    """1.20 ignores the CRDs' CEL immutability rule, so the operator reports the edit and ignores it."""
    env.cluster.create(c.PLURAL_SNAPSHOT_JOBS, snapshot_job("cap"), ns)
    wait_for(lambda: cond_is(get_sj(env, ns), c.COND_RUNNING), what="Running")
    env.cluster.kube.custom.patch_namespaced_custom_object(
        c.GROUP, c.VERSION, ns, c.PLURAL_SNAPSHOT_JOBS, "cap", {"spec": {"activeDeadlineSeconds": 7}},
        _content_type="application/merge-patch+json",
    )  # fmt: skip
    wait_for(
        lambda: [e for e in env.cluster.kube.core.list_namespaced_event(ns).items if e.reason == "SpecImmutable"],
        what="SpecImmutable Event",
    )
    job = env.cluster.kube.batch.read_namespaced_job("cap", ns)
    assert job.spec.active_deadline_seconds == 3600


def test_a_stricter_localhost_profile_of_the_template_is_kept_with_an_event(env: Env, ns: str) -> None:
    """podsnap's profile is the runtime default minus io_uring: it replaces RuntimeDefault, never a
    Localhost profile the user chose, which may be stricter; the SnapshotJob says io_uring is not blocked."""
    worker = {"name": "main", "image": "worker:1", "command": ["python", "-m", "worker"]}
    strict = {"type": "Localhost", "localhostProfile": "team/strict.json"}
    job = snapshot_job("own", containers=[worker])
    job["spec"]["podTemplate"]["spec"]["securityContext"] = {"seccompProfile": strict}
    env.cluster.create(c.PLURAL_SNAPSHOT_JOBS, job, ns)
    default = snapshot_job(
        "rd", containers=[{**worker, "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}}]
    )
    env.cluster.create(c.PLURAL_SNAPSHOT_JOBS, default, ns)

    def kept_events(name: str) -> list[Any]:
        items = env.cluster.kube.core.list_namespaced_event(ns).items
        return [e for e in items if e.reason == c.REASON_SECCOMP_PROFILE_KEPT and e.involved_object.name == name]

    [kept] = wait_for(lambda: kept_events("own"), timeout=30, what="SeccompProfileKept event")
    assert kept.type == "Normal"
    assert "pod (team/strict.json)" in kept.message and "io_uring" in kept.message
    shaped = env.cluster.kube.sanitize(env.cluster.kube.batch.read_namespaced_job("own", ns))["spec"]["template"]
    assert shaped["spec"]["securityContext"]["seccompProfile"] == strict

    ours = {"type": "Localhost", "localhostProfile": "podsnap/checkpoint.json"}
    rd = wait_for(lambda: get_job(env, ns, "rd"), timeout=30, what="capture Job rd")["spec"]["template"]["spec"]
    assert rd["securityContext"]["seccompProfile"] == ours
    assert rd["containers"][0]["securityContext"]["seccompProfile"] == ours
    wait_for(lambda: any(e.reason == "JobCreated" for e in events_on(env, ns, "rd")), timeout=30, what="JobCreated")
    assert not kept_events("rd")


def test_a_template_with_the_deprecated_seccomp_annotation_still_makes_a_capture_pod(env: Env, ns: str) -> None:
    """Kubernetes 1.20 refuses a pod whose seccomp annotation and field differ: podsnap's field must not
    leave the template's runtime/default annotation beside it, or the Job never gets its pod."""
    job = snapshot_job("annotated")
    job["spec"]["podTemplate"]["metadata"]["annotations"] = {
        "seccomp.security.alpha.kubernetes.io/pod": "runtime/default"
    }
    env.cluster.create(c.PLURAL_SNAPSHOT_JOBS, job, ns)
    pod = capture_pod(env, ns, "annotated")
    assert pod["spec"]["securityContext"]["seccompProfile"] == {
        "type": "Localhost",
        "localhostProfile": "podsnap/checkpoint.json",
    }


def get_job(env: Env, ns: str, name: str) -> dict[str, Any] | None:
    from kubernetes.client.exceptions import ApiException

    try:
        return env.cluster.kube.sanitize(env.cluster.kube.batch.read_namespaced_job(name, ns))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def events_on(env: Env, ns: str, name: str) -> list[Any]:
    return [e for e in env.cluster.kube.core.list_namespaced_event(ns).items if e.involved_object.name == name]
