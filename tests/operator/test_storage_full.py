"""A capture refuses to start, with reason StorageFull, when the artifact volume has not the room for what it
would write at least (the source's resident memory): the source is not touched and keeps running. A real
agent on a real, tiny tmpfs volume, against the real API server; the executor is the recording fake."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from podsnap import contract as c
from podsnap.agent import main as agent_main
from tests.support.harness import KopfThread, cgroups_writable, condition
from tests.support.operator_env import OTHER_NODE, Env, agent_kubeconfig, failed_with, podsnapshot, running_pod
from tests.support.recording import RecordingExecutor
from tests.support.small_fs import small_tmpfs

pytestmark = pytest.mark.skipif(cgroups_writable() is not None, reason=str(cgroups_writable()))


@pytest.fixture
def tiny_volume(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "tiny", "64k") as volume:
        yield volume


def test_a_capture_without_room_on_the_volume_is_refused_and_the_source_keeps_running(
    env: Env, ns: str, tiny_volume: Path
) -> None:
    executor = RecordingExecutor()
    # node-b's agent, with a token bound to its own pod (the operator's webhook holds agents to their node)
    kubeconfig = agent_kubeconfig(env.cluster, OTHER_NODE, env.agent_kubeconfig, tiny_volume.parent / "b.kubeconfig")
    config = dataclasses.replace(
        env.agent_ctx.config, node_name=OTHER_NODE, artifact_root=tiny_volume, kubeconfig=str(kubeconfig)
    )
    agent_b = KopfThread("agent-b", agent_main.run, agent_main.build_context(config, executor)).start()
    try:
        _, source = running_pod(env, ns, "src", node=OTHER_NODE)
        env.cluster.create(c.PLURAL_POD_SNAPSHOTS, podsnapshot("s", "src"), ns)
        snap = failed_with(env, ns, "s", c.REASON_STORAGE_FULL)
    finally:
        agent_b.stop()
    message = (condition(snap, c.COND_FAILED) or {})["message"]
    assert "MiB free" in message and "keeps running" in message, message
    assert not executor.of("capture", "src", ns), "nothing may touch the source"
    assert source.proc is not None and source.proc.poll() is None, "the source keeps running"
    assert not [p for p in tiny_volume.rglob("*") if p.is_file()], "no half artifact on the volume"
