"""What an agent finds when it starts after an earlier one died mid-operation: staging dirs of its node's
captures and artifacts renamed aside for deletion are removed, another node's left alone (the volume may
be shared, and that node's capture may be live); a restore left half done is killed in its container and
the pod falls back. Real API server and agent (a fresh one: nothing in
memory); the executor is the recording fake."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from podsnap import contract as c
from podsnap.agent import main as agent_main
from podsnap.agent import on_pod, restore_record
from podsnap.operator.restore_pod import shape
from tests.support.harness import cgroups_writable, condition
from tests.support.operator_env import NODE, OTHER_NODE, Env, golden, podsnapshot, restore_token, running_pod
from tests.support.processes import children_of
from tests.support.waiting import wait_for

pytestmark = pytest.mark.skipif(cgroups_writable() is not None, reason=str(cgroups_writable()))


def artifact_of(env: Env, ns: str, snapshot: str) -> Path:
    def bound() -> Path | None:
        snap = env.cluster.get(c.PLURAL_POD_SNAPSHOTS, snapshot, ns)
        content = snap and env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, c.content_name(snap["metadata"]["uid"]))
        return env.artifact_root / content["spec"]["artifactPath"] if content else None

    return wait_for(bound, what=f"the content of {snapshot}")


def leftover(next_to: Path, kind: str) -> Path:
    d = next_to.parent / f".{next_to.name}.{kind}"
    (d / "criu").mkdir(parents=True)
    (d / "criu" / "pages-1.img").write_bytes(b"\0" * 4096)
    return d


def test_a_starting_agent_removes_what_its_node_left_half_done_and_only_that(env: Env, ns: str) -> None:
    golden(env, ns)  # captured on this agent's node
    mine = artifact_of(env, ns, "golden")
    running_pod(
        env, ns, "elsewhere", node=OTHER_NODE, job="theirs"
    )  # node-b runs no agent here: its capture stays Pending
    env.cluster.create(c.PLURAL_POD_SNAPSHOTS, podsnapshot("theirs", "elsewhere"), ns)
    theirs = artifact_of(env, ns, "theirs")
    staging = leftover(mine, "staging-0123456789ab")
    deleting = leftover(mine, "deleting-01234567")
    live = leftover(theirs, "staging-ba9876543210")
    unrelated = leftover(mine, "notes")
    published = sorted(p.name for p in mine.iterdir()) if mine.is_dir() else []

    env.agent.stop()  # the agent died; a new process starts
    env.agent.ctx = agent_main.build_context(env.agent_ctx.config, env.executor, env.agent_ctx.node_facts)
    env.agent.start()

    wait_for(lambda: not staging.exists() and not deleting.exists(), what="the leftovers of this node removed")
    assert live.is_dir(), "another node's staging may be a capture in flight: never removed"
    assert unrelated.is_dir(), "only podsnap's own leftovers are removed"
    assert (sorted(p.name for p in mine.iterdir()) if mine.is_dir() else []) == published, "the artifact stays"


@pytest.fixture
def pid_namespace() -> Iterator[tuple[int, int]]:
    """(the PID 1 of a new PID namespace, standing in for the pod's pause; a child of it, standing in for
    the worker CRIU restored and re-parented to pause)."""
    unshare = subprocess.Popen(["unshare", "--pid", "--fork", "sh", "-c", "sleep 300 & wait"])
    try:
        pause = wait_for(lambda: (k := children_of(unshare.pid)) and k[0], what="the namespace's PID 1")
        worker = wait_for(lambda: (k := children_of(pause)) and k[0], what="the worker in it")
        yield pause, worker
    finally:
        unshare.kill()
        unshare.wait()


def test_a_restore_the_earlier_agent_left_half_done_is_killed_and_the_pod_falls_back(
    env: Env, ns: str, tmp_path: Path, pid_namespace: tuple[int, int]
) -> None:
    golden(env, ns)
    _, restored_worker = pid_namespace
    control = tmp_path / "ctl"
    control.mkdir()
    env.agent.stop()  # the agent dies in the middle of a restore into this pod
    pod = {
        "metadata": {"name": "r"},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "worker:1",
                    "command": ["python", "-m", "worker"],
                    "env": [{"name": c.ENV_CONTROL_DIR, "value": str(control)}],
                }
            ]
        },
    }
    shaped = shape(pod, snapshot="golden", container="main")
    shaped["metadata"]["annotations"][c.ANNOTATION_RESTORE_TOKEN] = restore_token(env, ns, "golden")
    env.cluster.kube.core.create_namespaced_pod(ns, shaped)
    env.cluster.kubelet_bind(ns, "r", NODE)
    placeholder = env.cluster.kubelet_container({c.ENV_CONTROL_DIR: str(control)})
    env.cluster.kubelet_run(ns, "r", ready=False, container_ids={"main": placeholder.container_id})
    # the earlier agent's own record of the restore it began: what makes it an interrupted one
    uid = (env.cluster.pod(ns, "r") or {})["metadata"]["uid"]
    restore_record.begin(on_pod.records(env.agent_ctx), uid, placeholder.container_id)
    in_progress = {
        "type": c.POD_CONDITION_RESTORED,
        "status": "False",
        "reason": c.REASON_RESTORE_IN_PROGRESS,
        "message": "restoring from golden",
        "lastTransitionTime": "2026-12-01T00:00:00Z",
    }
    current = env.cluster.pod(ns, "r") or {}
    conds = [*((current.get("status") or {}).get("conditions") or []), in_progress]
    env.cluster.kube.core.patch_namespaced_pod_status("r", ns, {"status": {"conditions": conds}})
    # what CRIU had restored: in the container's cgroups, a child of the pod's PID 1
    (placeholder.cgroup / "cgroup.procs").write_text(f"{restored_worker}\n")

    env.agent.ctx = agent_main.build_context(env.agent_ctx.config, env.executor, env.agent_ctx.node_facts)
    env.agent.start()

    def verdict() -> dict[str, Any] | None:
        cond = condition(env.cluster.pod(ns, "r"), c.POD_CONDITION_RESTORED)
        return cond if cond and cond["reason"] != c.REASON_RESTORE_IN_PROGRESS else None

    cond = wait_for(verdict, what="a verdict on the half-restored pod")
    assert cond["reason"] == c.REASON_FELL_BACK_TO_COLD_START, cond
    assert cond["message"].startswith(f"{c.REASON_AGENT_RESTARTED}: "), cond
    assert f"killed what it had restored (pids [{restored_worker}])" in cond["message"], cond
    wait_for(lambda: not Path(f"/proc/{restored_worker}").exists(), what="the half-restored worker gone")
    assert placeholder.proc is not None and placeholder.proc.poll() is None, "the container's own process lives"
    # the pod's condition and the control-dir file are two writes: the file may follow the condition
    wait_for(
        lambda: (control / c.FILE_RESTORE_FAILED).read_text().startswith(f"{c.REASON_AGENT_RESTARTED}: "),
        what="the placeholder told to start cold, with the cause",
    )
    assert not env.executor.of("restore", "r", ns), "nothing is restored into it again"
    assert restore_record.interrupted(on_pod.records(env.agent_ctx), uid) is None, "the record is dropped"


def test_a_running_agent_sweeps_leftovers_next_to_its_ready_artifacts(env: Env, ns: str) -> None:
    golden(env, ns)  # Ready: its capture is over, and its path is never captured into again
    mine = artifact_of(env, ns, "golden")
    staging = leftover(mine, "staging-feedfacecafe")
    deleting = leftover(mine, "deleting-feedface")
    unrelated = leftover(mine, "notes")
    wait_for(lambda: not staging.exists() and not deleting.exists(), what="the leftovers swept by the running agent")
    assert unrelated.is_dir()
