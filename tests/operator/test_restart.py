"""The operator killed mid-flow and restarted converges to the same result, with no duplicate objects."""

from __future__ import annotations

from podsnap import contract as c
from podsnap.operator import main as operator_main
from tests.support.harness import cond_is
from tests.support.operator_env import Env, kubelet_starts_capture_pod, snapshot_job
from tests.support.waiting import wait_for


def test_operator_restart_mid_capture_converges_without_duplicates(env: Env, ns: str) -> None:
    env.cluster.create(c.PLURAL_SNAPSHOT_JOBS, snapshot_job("cap"), ns)
    wait_for(
        lambda: cond_is(
            env.cluster.get(c.PLURAL_SNAPSHOT_JOBS, "cap", ns), c.COND_RUNNING, reason=c.REASON_POD_PENDING
        ),
        what="PodPending",
    )
    env.operator.stop()  # killed between "Job created" and "pod Ready"
    try:
        pod, _ = kubelet_starts_capture_pod(env, ns, "cap")
    finally:
        env.operator.ctx = operator_main.build_context(env.operator_ctx.config)  # a fresh process: nothing in memory
        env.operator.start()
    sj = wait_for(
        lambda: cond_is(s := env.cluster.get(c.PLURAL_SNAPSHOT_JOBS, "cap", ns), c.COND_COMPLETED) and s,
        timeout=30,
        what="Completed",
    )
    snapshots = env.cluster.kube.custom.list_namespaced_custom_object(c.GROUP, c.VERSION, ns, c.PLURAL_POD_SNAPSHOTS)[
        "items"
    ]
    assert [s["metadata"]["name"] for s in snapshots] == ["cap"]
    contents = [
        x
        for x in env.cluster.kube.custom.list_cluster_custom_object(c.GROUP, c.VERSION, c.PLURAL_POD_SNAPSHOT_CONTENTS)[
            "items"
        ]
        if x["spec"]["podSnapshotRef"]["namespace"] == ns
    ]
    assert len(contents) == 1 and contents[0]["metadata"]["name"] == c.content_name(sj["status"]["podSnapshotUID"])
    assert len(env.executor.of("capture", pod["metadata"]["name"], ns)) == 1


def test_operator_restart_after_the_snapshot_was_created_converges(env: Env, ns: str) -> None:
    env.executor.capture_delay_s = 2.0  # a capture still running while the operator is away
    try:
        env.cluster.create(c.PLURAL_SNAPSHOT_JOBS, snapshot_job("cap"), ns)
        pod, _ = kubelet_starts_capture_pod(env, ns, "cap")
        wait_for(lambda: env.executor.of("capture", pod["metadata"]["name"], ns), what="capture started")
        env.operator.stop()
    finally:
        env.executor.capture_delay_s = 0.0
    env.operator.ctx = operator_main.build_context(env.operator_ctx.config)
    env.operator.start()
    wait_for(
        lambda: cond_is(env.cluster.get(c.PLURAL_SNAPSHOT_JOBS, "cap", ns), c.COND_COMPLETED),
        timeout=30,
        what="Completed",
    )
    assert cond_is(env.cluster.get(c.PLURAL_POD_SNAPSHOTS, "cap", ns), c.COND_READY)
    assert len(env.executor.of("capture", pod["metadata"]["name"], ns)) == 1


def test_operator_sigkilled_mid_flow_converges_without_duplicates(env: Env, ns: str) -> None:
    """A real kill: the `podsnap-operator` process gets SIGKILL after creating the Job; the operator started
    afterwards finishes the same capture."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    env.operator.stop()
    proc = None
    try:
        # the process serves the webhooks in the stopped operator's place (the validating one is failurePolicy Fail)
        webhook = {
            c.ENV_WEBHOOK_PORT: str(env.webhook_port),
            c.ENV_WEBHOOK_CERT_DIR: str(env.operator_ctx.config.webhook_cert_dir),
            c.ENV_TOKEN_KEY_DIR: str(env.operator_ctx.config.token_key_dir),
        }
        environ = {**os.environ, **webhook, c.ENV_METRICS_PORT: "0", c.ENV_HEALTH_PORT: "0"}
        exe = Path(sys.executable).parent / "podsnap-operator"
        proc = subprocess.Popen([str(exe), "--kubeconfig", str(env.operator_kubeconfig)], env=environ)
        # admitted once the process's webhook server listens
        wait_for(
            lambda: env.cluster.create(c.PLURAL_SNAPSHOT_JOBS, snapshot_job("cap"), ns), what="SnapshotJob admitted"
        )
        wait_for(lambda: env.cluster.kube.batch.list_namespaced_job(ns).items, what="Job from the process")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        pod, _ = kubelet_starts_capture_pod(env, ns, "cap")
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        env.operator.ctx = operator_main.build_context(env.operator_ctx.config)
        env.operator.start()
    wait_for(
        lambda: cond_is(env.cluster.get(c.PLURAL_SNAPSHOT_JOBS, "cap", ns), c.COND_COMPLETED),
        what="Completed",
        timeout=120,
    )
    assert [
        s["metadata"]["name"]
        for s in env.cluster.kube.custom.list_namespaced_custom_object(c.GROUP, c.VERSION, ns, c.PLURAL_POD_SNAPSHOTS)[
            "items"
        ]
    ] == ["cap"]
    assert len(env.executor.of("capture", pod["metadata"]["name"], ns)) == 1
