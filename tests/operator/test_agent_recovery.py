"""What an agent finds when it starts after an earlier one died mid-operation: staging dirs of its node's
captures and artifacts renamed aside for deletion are removed; another node's are left alone (the volume
may be shared, and that node's capture may be live). Real API server and agent (a fresh one: nothing in
memory); the executor is the recording fake."""

from __future__ import annotations

from pathlib import Path

import pytest

from podsnap import contract as c
from podsnap.agent import main as agent_main
from tests.support.harness import cgroups_writable
from tests.support.operator_env import OTHER_NODE, Env, golden, podsnapshot, running_pod
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
    running_pod(env, ns, "elsewhere", node=OTHER_NODE)  # node-b runs no agent here: its capture stays Pending
    env.cluster.create(c.PLURAL_POD_SNAPSHOTS, podsnapshot("theirs", "elsewhere"), ns)
    theirs = artifact_of(env, ns, "theirs")
    staging = leftover(mine, "staging-0123456789ab")
    deleting = leftover(mine, "deleting-01234567")
    live = leftover(theirs, "staging-ba9876543210")
    unrelated = leftover(mine, "notes")
    published = sorted(p.name for p in mine.iterdir()) if mine.is_dir() else []

    env.agent.stop()  # the agent died; a new process starts
    env.agent.ctx = agent_main.build_context(env.agent_ctx.config, env.executor)
    env.agent.start()

    wait_for(lambda: not staging.exists() and not deleting.exists(), what="the leftovers of this node removed")
    assert live.is_dir(), "another node's staging may be a capture in flight: never removed"
    assert unrelated.is_dir(), "only podsnap's own leftovers are removed"
    assert (sorted(p.name for p in mine.iterdir()) if mine.is_dir() else []) == published, "the artifact stays"
