"""docs/security.md, the finding on the container named by the pod's status: the container the agent acts on is named by the pod's status, which a namespace user may write.
Each test performs the attack against the real API server, operator and agent, with real processes in real
cgroups: a status naming a partial container ID, or another pod's container, gets the pod or snapshot
refused with `RestoreRefused` or `ContainerRefused` (condition + Event), and the other pod's processes are
neither killed nor captured."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from podsnap import contract as c
from podsnap.agent import main as agent_main
from podsnap.agent import on_pod, restore_record
from podsnap.operator.restore_pod import shape
from tests.support.harness import cgroups_writable, cond_is, condition, new_container_id, pod_cgroup
from tests.support.operator_env import (
    NODE,
    Env,
    capture_token,
    failed_with,
    golden,
    podsnapshot,
    restore_token,
    running_pod,
)
from tests.support.processes import children_of
from tests.support.waiting import wait_for

pytestmark = pytest.mark.skipif(cgroups_writable() is not None, reason=str(cgroups_writable()))

#: the systemd driver's `cri-containerd-<id>.scope`: a substring match on `containerd-0` found every such
#: container whose ID starts with 0
VICTIM_ID = "0" + new_container_id()[1:]


@contextlib.contextmanager
def adopted_worker() -> Iterator[int]:
    """A worker as CRIU leaves a restored one: a child of its pod's PID 1 (a PID namespace of its own)."""
    unshare = subprocess.Popen(["unshare", "--pid", "--fork", "sh", "-c", "sleep 300 & wait"])
    pause = 0
    try:
        pause = wait_for(lambda: (k := children_of(unshare.pid)) and k[0], what="the pod's PID 1")
        yield wait_for(lambda: (k := children_of(pause)) and k[0], what="the worker")
    finally:
        if pause:  # the namespace's PID 1 takes every process of its namespace with it; unshare alone would not
            with contextlib.suppress(ProcessLookupError):
                os.kill(pause, signal.SIGKILL)
        unshare.kill()
        unshare.wait()


@pytest.fixture
def victim() -> Iterator[int]:
    """A restored worker of another pod, in its container's cgroup under that pod's (systemd layout), its
    container ID starting with 0."""
    cgroup = pod_cgroup(str(uuid.uuid4()), VICTIM_ID, systemd=True)
    try:
        with adopted_worker() as worker:
            cgroup.mkdir(parents=True)
            (cgroup / "cgroup.procs").write_text(str(worker))
            yield worker
    finally:
        wait_for(lambda: not cgroup.exists() or not (cgroup / "cgroup.procs").read_text().strip(), what="empty")
        for d in (cgroup, cgroup.parent):
            with contextlib.suppress(OSError):
                d.rmdir()


def alive(pid: int) -> bool:
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def events(env: Env, ns: str, reason: str, name: str) -> list[Any]:
    return [
        e
        for e in env.cluster.kube.core.list_namespaced_event(ns).items
        if e.reason == reason and e.involved_object.name == name
    ]


def spoofed_status(container_id: str, *, restoring: bool) -> dict[str, Any]:
    """What the attacker writes into its own pod's status (pods/status patch)."""
    now = "2026-12-01T00:00:00Z"
    status: dict[str, Any] = {
        "phase": "Running",
        "containerStatuses": [
            {
                "name": "main",
                "image": "worker:1",
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "containerID": container_id,
                "state": {"running": {"startedAt": now}},
            }
        ],
    }
    if restoring:
        status["conditions"] = [
            {
                "type": c.POD_CONDITION_RESTORED,
                "status": "False",
                "reason": c.REASON_RESTORE_IN_PROGRESS,
                "message": "restoring from x",
                "lastTransitionTime": now,
            }
        ]
    return status


def attacker_pod(env: Env, ns: str, name: str, control: Path, token: str | None) -> None:
    """A pod on the victim's node, shaped like a restore pod (what a user can write by hand), that claims a
    restore into it was interrupted; with a valid restore token (a pod the webhook shaped for the user's own
    snapshot) or none. Its status is written in one patch, so the agent sees the spoofed container and the
    condition together."""
    control.mkdir(parents=True, exist_ok=True)
    container = {
        "name": "main",
        "image": "worker:1",
        "command": ["python", "-m", "worker"],
        "env": [{"name": c.ENV_CONTROL_DIR, "value": str(control)}],
    }
    pod = shape({"metadata": {"name": name}, "spec": {"containers": [container]}}, snapshot="x", container="main")
    if token is not None:
        pod["metadata"]["annotations"][c.ANNOTATION_RESTORE_TOKEN] = token
    pod["spec"]["nodeName"] = NODE
    env.cluster.kube.core.create_namespaced_pod(ns, pod)


def verdict(env: Env, ns: str, name: str) -> dict[str, Any]:
    def final() -> dict[str, Any] | None:
        cond = condition(env.cluster.pod(ns, name), c.POD_CONDITION_RESTORED)
        return cond if cond and cond["reason"] != c.REASON_RESTORE_IN_PROGRESS else None

    return wait_for(final, what=f"the agent's verdict on {name}")


#: (a valid restore token?, the containerID written, the verdict's reason, what its message says)
SPOOFS = {
    # the review's attack: no token, a prefix of every `cri-containerd-0…` scope
    "no-token": (False, "containerd://containerd-0", c.REASON_RESTORE_REFUSED, "was not shaped for restore by podsnap"),
    "prefix": (True, "containerd://containerd-0", c.REASON_CONTAINER_REFUSED, "is not a whole container ID"),
    "other-pods-container": (True, f"containerd://{VICTIM_ID}", c.REASON_CONTAINER_REFUSED, "another pod's cgroup"),
}


@pytest.mark.parametrize("spoof", sorted(SPOOFS))
def test_a_spoofed_interrupted_restore_kills_nothing_of_another_pod(
    env: Env, ns: str, tmp_path: Path, victim: int, spoof: str
) -> None:
    token, container_id, reason, says = SPOOFS[spoof]
    control, name = tmp_path / "ctl", f"r-{spoof}"  # the parameters share a namespace
    attacker_pod(env, ns, name, control, restore_token(env, ns, "x") if token else None)
    env.cluster.kube.core.patch_namespaced_pod_status(
        name, ns, {"status": spoofed_status(container_id, restoring=True)}
    )

    cond = verdict(env, ns, name)
    assert cond["reason"] == reason and says in cond["message"], cond
    assert wait_for(lambda: events(env, ns, reason, name), what=f"a Warning Event {reason}")
    assert alive(victim), "the other pod's worker was killed"
    assert not (control / c.FILE_RESTORE_FAILED).exists(), "nothing is written for a refused pod"
    assert not env.executor.of("restore", name, ns)


@pytest.mark.parametrize(
    ("spoof", "says"),
    [("prefix", "is not a whole container ID"), ("other-pods-container", "another pod's cgroup")],
)
def test_a_capture_pod_naming_another_container_is_refused(env: Env, ns: str, spoof: str, says: str) -> None:
    """A capture source (a SnapshotJob's pod, token valid) whose status its user rewrote to name another pod's
    container: the agent would dump that container's tree into this namespace's artifact, and end it."""
    src, db, steal = f"src-{spoof}", f"db-{spoof}", f"steal-{spoof}"  # the parameters share a namespace
    _, other = running_pod(env, ns, db, token=None)
    running_pod(env, ns, src, token=capture_token(env, ns, job=steal))
    container_id = (
        f"containerd://{other.container_id[:20]}" if spoof == "prefix" else f"containerd://{other.container_id}"
    )
    status = (env.cluster.pod(ns, src) or {})["status"]
    status["containerStatuses"][0]["containerID"] = container_id
    env.cluster.kube.core.patch_namespaced_pod_status(src, ns, {"status": status})

    env.cluster.create(c.PLURAL_POD_SNAPSHOTS, podsnapshot(steal, src), ns)
    snap = failed_with(env, ns, steal, c.REASON_CONTAINER_REFUSED)
    assert says in (condition(snap, c.COND_FAILED) or {})["message"], snap
    assert wait_for(lambda: events(env, ns, c.REASON_CONTAINER_REFUSED, steal), what="a Warning Event")
    assert not env.executor.of("capture", src, ns), "nothing is captured"
    assert other.proc is not None and other.proc.poll() is None, "the other pod's container keeps running"


def test_a_restore_only_the_status_claims_kills_nothing_even_in_the_pods_own_container(
    env: Env, ns: str, tmp_path: Path
) -> None:
    """That a restore was interrupted is the agent's own record's word (agent/restore_record.py): a pod podsnap
    shaped (token valid) whose user writes `RestoreInProgress` into its status, with its own container's
    whole ID, gets no process of that container killed; it falls back to cold as after any restart."""
    control = tmp_path / "ctl"
    env.agent.stop()  # the claim is read by a starting agent, as after a real interruption
    try:
        attacker_pod(env, ns, "r", control, restore_token(env, ns, "x"))
        placeholder = env.cluster.kubelet_container({c.ENV_CONTROL_DIR: str(control)})
        env.cluster.kubelet_run(ns, "r", ready=False, container_ids={"main": placeholder.container_id})
        status = spoofed_status(f"containerd://{placeholder.container_id}", restoring=True)
        env.cluster.kube.core.patch_namespaced_pod_status("r", ns, {"status": status})
        with adopted_worker() as worker:
            (placeholder.cgroup / "cgroup.procs").write_text(str(worker))  # adopted by the pod's PID 1
            env.agent.ctx = agent_main.build_context(env.agent_ctx.config, env.executor, env.agent_ctx.node_facts)
            env.agent.start()
            cond = verdict(env, ns, "r")
            assert cond["reason"] == c.REASON_FELL_BACK_TO_COLD_START, cond
            assert "has no record of beginning it, so nothing was killed" in cond["message"], cond
            assert alive(worker), "a process of the pod's container was killed on the status' word"
    finally:
        if env.agent.thread is None:
            env.agent.start()


def test_the_agent_records_a_restore_before_criu_runs_and_drops_the_record_after(
    env: Env, ns: str, tmp_path: Path
) -> None:
    """The record a successor would act on exists exactly while the restore runs, naming the container."""
    from tests.operator.test_tokens import handmade_restore_pod

    seen: list[str | None] = []
    records = on_pod.records(env.agent_ctx)
    env.executor.during_restore = lambda req: (
        seen.append(restore_record.interrupted(records, req.pod.uid)) if req.pod.namespace == ns else None
    )
    try:
        golden(env, ns)
        pod = handmade_restore_pod(env, ns, "r", "golden", tmp_path / "ctl", token=restore_token(env, ns, "golden"))
        [call] = wait_for(lambda: env.executor.of("restore", "r", ns), what="the restore")
        wait_for(lambda: cond_is(env.cluster.pod(ns, "r"), c.POD_CONDITION_RESTORED), what="restored")
    finally:
        env.executor.during_restore = None
    assert seen == [call.request.pod.container_id.split("://")[-1]], f"recorded before CRIU, with its container: {seen}"
    assert restore_record.interrupted(records, pod["metadata"]["uid"]) is None, "dropped with the verdict"
