"""An agent that died in the middle of a capture left its source CUDA-checkpointed and the capture's
journal record in its node-local state directory; the agent that starts next gives the source its CUDA
state back, removes the record and fails the content with reason AgentRestarted, saying what it recovered.
A record on the shared artifact volume (where agents once kept them, and where anyone who can write the
claim can plant one) is removed unread and never acted on. Real API server,
operator and agent; the recovery is the agent's real executor's (`EngineExecutor`, the engine's journal)
on a real source process, everything else the recording stand-in; the CUDA driver is the FAKE of
tests/support/fake_cuda.py (tests/gpu/test_capture_recovery.py: the real one)."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from podsnap import contract as c
from podsnap.agent import main as agent_main
from podsnap.agent.engine_executor import EngineExecutor
from podsnap.agent.executor import CaptureRecovered
from podsnap.engine import _journal as journal  # the capture's own journal writer, as the dead agent ran it
from podsnap.engine import _proctree as proctree
from tests.support.fake_cuda import CHECKPOINTED, RUNNING, FakeCudaDriver
from tests.support.harness import cond_is, condition
from tests.support.operator_env import Env, podsnapshot, running_pod
from tests.support.processes import Worker, http_get
from tests.support.recording import RecordingExecutor
from tests.support.waiting import wait_for


@dataclass
class RecoveringRecorder(RecordingExecutor):
    """The recording stand-in, whose recovery is the real executor's (the rest needs no CRIU here)."""

    engine: EngineExecutor | None = None

    def recover_captures(self) -> list[CaptureRecovered]:
        assert self.engine is not None
        return self.engine.recover_captures()


@pytest.fixture
def source(tmp_path: Path) -> Iterator[Worker]:
    w = Worker(tmp_path / "worker")
    yield w
    w.kill()


def test_a_starting_agent_gives_a_cuda_checkpointed_source_back_and_fails_its_capture(
    env: Env, ns: str, tmp_path: Path, source: Worker
) -> None:
    config, facts = env.agent_ctx.config, env.agent_ctx.node_facts  # the suite's node facts, kept for the others
    env.agent.stop()  # the agent died in the middle of this capture
    try:
        running_pod(env, ns, "p")
        snap = env.cluster.create(c.PLURAL_POD_SNAPSHOTS, podsnapshot("s", "p"), ns)
        name = c.content_name(snap["metadata"]["uid"])
        wait_for(lambda: env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, name), what="content")
        in_progress = {
            "type": c.COND_READY,
            "status": "False",
            "reason": c.REASON_CAPTURE_IN_PROGRESS,
            "message": "capturing",
            "lastTransitionTime": "2026-12-01T00:00:00Z",
        }
        env.cluster.kube.custom.patch_cluster_custom_object_status(
            c.GROUP, c.VERSION, c.PLURAL_POD_SNAPSHOT_CONTENTS, name, {"status": {"conditions": [in_progress]}}
        )
        driver = FakeCudaDriver(tmp_path / "cuda", [source.pid])
        # where the chart's agent keeps it: its node-local state, not the artifact volume
        assert config.journal_dir.is_relative_to(config.state_dir)
        assert not config.journal_dir.is_relative_to(config.artifact_root)
        record = journal.Journal(config.journal_dir / f"{name}.json", {"content": name})
        record.begin(source.pid, [source.pid], [source.pid], leave_running=False)
        for step, call in ((journal.STEP_CUDA_LOCK, driver.lock), (journal.STEP_CUDA_CHECKPOINT, driver.checkpoint)):
            record.step(step)
            call(source.pid)
        assert driver.state(source.pid) == CHECKPOINTED

        engine = EngineExecutor(journal_dir=config.journal_dir, cuda=FakeCudaDriver(tmp_path / "cuda"))
        executor = RecoveringRecorder(engine=engine)
        env.agent.ctx = agent_main.build_context(config, executor, facts)
        env.agent.start()

        content = wait_for(
            lambda: cond_is(got := env.cluster.get(c.PLURAL_POD_SNAPSHOT_CONTENTS, name), c.COND_FAILED) and got,
            what="the content Failed",
        )
        failed = condition(content, c.COND_FAILED)
        assert failed is not None and failed["reason"] == c.REASON_AGENT_RESTARTED, failed
        assert f"cuCheckpointProcessRestore pid {source.pid}" in failed["message"]
        assert f"cuCheckpointProcessUnlock pid {source.pid}" in failed["message"]
        assert "at step cuda_checkpoint" in failed["message"]
        assert driver.state(source.pid) == RUNNING
        assert http_get(source.port)["init_id"] == source.init_id, "the source serves its own state again"
        assert not (config.journal_dir / f"{name}.json").exists(), "the record is gone: recovered once"
        sample = env.agent_ctx.metrics.registry.get_sample_value
        assert sample("podsnap_agent_capture_recoveries_total", {"outcome": "recovered"}) == 1
        wait_for(
            lambda: cond_is(
                env.cluster.get(c.PLURAL_POD_SNAPSHOTS, "s", ns), c.COND_FAILED, reason=c.REASON_AGENT_RESTARTED
            ),
            what="the PodSnapshot Failed/AgentRestarted",
        )
        events = wait_for(
            lambda: [
                e for e in env.cluster.kube.core.list_namespaced_event(ns).items if e.reason == c.REASON_AGENT_RESTARTED
            ],
            what="an AgentRestarted Event on the PodSnapshot",
        )
        assert events[0].type == "Warning"
        assert not executor.of("capture", "p", ns), "the abandoned capture is not run again"
    finally:
        env.agent.stop()
        env.agent.ctx = agent_main.build_context(config, env.executor, facts)
        env.agent.start()


def test_a_record_planted_on_the_artifact_volume_is_removed_unread_and_never_acted_on(
    env: Env, tmp_path: Path, source: Worker, caplog: pytest.LogCaptureFixture
) -> None:
    """Where agents once kept the journal (`<artifactRoot>/.journal/<node>`), a record naming a real source of
    this node that is stopped and CUDA-checkpointed: a starting agent that trusted it would continue the
    source and give it its CUDA state back (as the test above shows for a record of its own). It does
    neither, and removes the record."""
    config, facts = env.agent_ctx.config, env.agent_ctx.node_facts
    env.agent.stop()
    planted_dir = config.artifact_root / ".journal" / config.node_name
    try:
        driver = FakeCudaDriver(tmp_path / "cuda", [source.pid])
        record = journal.Journal(planted_dir / "planted.json", {"content": "planted"})
        record.begin(source.pid, [source.pid], [source.pid], leave_running=False)
        for step, call in ((journal.STEP_CUDA_LOCK, driver.lock), (journal.STEP_CUDA_CHECKPOINT, driver.checkpoint)):
            record.step(step)
            call(source.pid)
        record.step(journal.STEP_CRIU_DUMP)
        os.kill(source.pid, signal.SIGSTOP)  # as a CRIU that died mid-dump leaves a tree
        assert proctree.wait_stopped([source.pid]) == []
        assert (planted_dir / "planted.json").exists()

        recovering = FakeCudaDriver(tmp_path / "cuda")
        engine = EngineExecutor(journal_dir=config.journal_dir, cuda=recovering)
        env.agent.ctx = agent_main.build_context(config, RecoveringRecorder(engine=engine), facts)
        with caplog.at_level(logging.WARNING):
            env.agent.start()  # ready once its startup (the recovery) ran
            wait_for(lambda: not (planted_dir / "planted.json").exists(), what="the planted record removed")

        assert driver.state(source.pid) == CHECKPOINTED, "its CUDA state was not touched"
        assert recovering.calls() == [("lock", source.pid), ("checkpoint", source.pid)], "the planting's only"
        assert proctree.state(source.pid) == "T", "the source was not continued"
        sample = env.agent_ctx.metrics.registry.get_sample_value
        assert not sample("podsnap_agent_capture_recoveries_total", {"outcome": "recovered"})
        warned = [r.getMessage() for r in caplog.records if "from the artifact volume" in r.getMessage()]
        assert len(warned) == 1 and "planted.json" in warned[0] and "never recovered from" in warned[0], warned
        assert not (config.artifact_root / ".journal").exists(), "no node has records there any more"
    finally:
        os.kill(source.pid, signal.SIGCONT)
        env.agent.stop()
        env.agent.ctx = agent_main.build_context(config, env.executor, facts)
        env.agent.start()
