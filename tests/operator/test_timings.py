"""The agent puts the timings it measures on the objects (capture phases on the PodSnapshotContent, mirrored
onto the PodSnapshot by the operator; restore phases in the pod's restore-timings annotation), and
`podsnap status` shows what the running operator and agent wrote (real API server, the kubelet played)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from podsnap import contract as c
from tests.support.harness import cgroups_writable, cond_is
from tests.support.operator_env import NODE, Env, capture_token, restore_token
from tests.support.recording import CAPTURE_TIMINGS_MS, RESTORE_TIMINGS_MS
from tests.support.waiting import wait_for

pytestmark = pytest.mark.skipif(cgroups_writable() is not None, reason=str(cgroups_writable()))


def admin_kubeconfig(env: Env, path: Path) -> Path:
    """A kubeconfig of the suite's admin client, for `podsnap status` run as a user would."""
    conf = env.cluster.kube.client.configuration
    token = conf.api_key["authorization"].removeprefix("Bearer ")
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "c", "cluster": {"server": conf.host, "certificate-authority": conf.ssl_ca_cert}}
                ],
                "users": [{"name": "admin", "user": {"token": token}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "admin"}}],
                "current-context": "c",
            }
        )
    )
    return path


def run_pod(env: Env, ns: str, name: str, pod: dict[str, Any], control: Path) -> None:
    """Create the pod; the kubelet (played) binds it to the agent's node and runs its container."""
    env.cluster.kube.core.create_namespaced_pod(ns, pod)
    env.cluster.kubelet_bind(ns, name, NODE)
    proc = env.cluster.kubelet_container({c.ENV_CONTROL_DIR: str(control)})
    env.cluster.kubelet_run(ns, name, ready=name == "source", container_ids={"main": proc.container_id})


def container(control: Path) -> dict[str, Any]:
    return {"name": "main", "image": "worker:1", "env": [{"name": c.ENV_CONTROL_DIR, "value": str(control)}]}


def test_capture_and_restore_timings_land_on_the_objects_and_in_status(env: Env, ns: str, tmp_path: Path) -> None:
    control = tmp_path / "control"
    control.mkdir()
    # a capture source as a SnapshotJob's pod is: marked with the operator's capture token
    source = {"name": "source", "annotations": {c.ANNOTATION_CAPTURE_TOKEN: capture_token(env, ns, job="snap")}}
    run_pod(env, ns, "source", {"metadata": source, "spec": {"containers": [container(control)]}}, control)
    env.cluster.create(
        c.PLURAL_POD_SNAPSHOTS,
        {
            "kind": c.KIND_POD_SNAPSHOT,
            "metadata": {"name": "snap"},
            "spec": {"source": {"podRef": {"name": "source", "containers": ["main"]}}},
        },
        ns,
    )
    snap = wait_for(
        lambda: cond_is(s := env.cluster.get(c.PLURAL_POD_SNAPSHOTS, "snap", ns), c.COND_READY) and s,
        what="snapshot Ready",
    )
    content = env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, snap["status"]["boundSnapshotContentName"])
    assert content is not None
    captured = content["status"]["captureTimingsMs"]
    assert {k: v for k, v in captured.items() if k != c.TIMING_AGENT_TOTAL} == CAPTURE_TIMINGS_MS
    assert captured[c.TIMING_AGENT_TOTAL] > 0
    mirrored = wait_for(
        lambda: env.cluster.get(c.PLURAL_POD_SNAPSHOTS, "snap", ns)["status"].get("captureTimingsMs"),
        what="timings mirrored onto the PodSnapshot",
    )
    assert mirrored == captured

    # a restore pod as the webhook shapes it (its annotation and label are what the agent acts on)
    restore_pod = {
        "metadata": {
            "name": "replica",
            "labels": {c.LABEL_RESTORE: "true"},
            "annotations": {
                c.ANNOTATION_RESTORE_FROM: "snap",
                c.ANNOTATION_RESTORE_CONTAINER: "main",
                c.ANNOTATION_RESTORE_TOKEN: restore_token(env, ns, "snap"),
            },
        },
        "spec": {"shareProcessNamespace": True, "containers": [{**container(control), "command": ["sleep", "inf"]}]},
    }
    run_pod(env, ns, "replica", restore_pod, control)
    restored = wait_for(
        lambda: (
            cond_is(p := env.cluster.pod(ns, "replica"), c.POD_CONDITION_RESTORED, reason=c.REASON_RESTORE_SUCCEEDED)
            and p
        ),
        what="replica Restored",
    )
    raw = restored["metadata"]["annotations"][c.ANNOTATION_RESTORE_TIMINGS]
    assert " " not in raw, "compact JSON"
    timings = c.parse_timings(raw)
    assert {k: v for k, v in timings.items() if k != c.TIMING_AGENT_TOTAL} == RESTORE_TIMINGS_MS
    assert timings[c.TIMING_AGENT_TOTAL] > 0

    kubeconfig = admin_kubeconfig(env, tmp_path / "admin.kubeconfig")
    got = subprocess.run(
        [
            sys.executable,
            "-m",
            "podsnap",
            "status",
            "pod/replica",
            "-n",
            ns,
            "-o",
            "json",
            "--kubeconfig",
            str(kubeconfig),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert got.returncode == 0, got.stderr
    doc = json.loads(got.stdout)
    [pod] = doc["pods"]
    assert pod["start"] == "restored" and pod["restoreTimingsMs"] == timings and pod["node"] == NODE
    assert doc["checkpoint"]["name"] == "snap" and doc["checkpoint"]["captureTimingsMs"] == captured
    assert doc["checkpoint"]["node"] == NODE and doc["checkpoint"]["sizeBytes"] > 0
