"""The agent's node-local state directory (agent/state_dir.py), as the real executor and the real
`podsnap-agent` process use it: the capture journal is made private, and a journal directory that is a
symlink, someone else's, or in a directory others can write is refused, by recovery (nothing in it is
read), by a capture (before it touches its source) and by the agent at start (it exits naming the fix)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from podsnap import contract as c
from podsnap.agent.engine_executor import EngineExecutor
from podsnap.agent.executor import CaptureRequest, ExecutionError, PodRef
from podsnap.agent.state_dir import UnsafeStateDir, drop_volume_journal, private_dir
from podsnap.engine import _journal as journal  # the capture's own journal writer
from podsnap.engine import _proctree as proctree
from tests.support.processes import Worker

BIN = Path(sys.executable).parent


@pytest.fixture
def stopped_source(tmp_path: Path) -> Iterator[Worker]:
    """A real process of this node; `plant` stops it as a CRIU that died mid-dump leaves it."""
    w = Worker(tmp_path / "worker")
    yield w
    w.kill()


def plant(journal_dir: Path, pid: int) -> Path:
    """A record at the step recovery SIGCONTs from (criu_dump), written by the engine's own writer while the
    process ran; then the process is stopped, as a CRIU that died in the dump leaves it."""
    record = journal.Journal(journal_dir / "c-1.json", {"content": "c-1"})
    record.begin(pid, [pid], [], leave_running=False)
    record.step(journal.STEP_CRIU_DUMP)
    os.kill(pid, signal.SIGSTOP)
    assert proctree.wait_stopped([pid]) == []
    assert record.path is not None
    return record.path


def test_the_journal_is_made_private_and_a_record_of_its_own_is_recovered(
    tmp_path: Path, stopped_source: Worker
) -> None:
    state = tmp_path / "state"
    made = private_dir(state / "journal")
    assert made == state / "journal"
    assert (state.stat().st_mode & 0o777, made.stat().st_mode & 0o777) == (0o700, 0o700)
    made.chmod(0o755)  # whatever a umask or an earlier version made: it is private again at the next use
    path = plant(made, stopped_source.pid)
    [found] = EngineExecutor(journal_dir=made).recover_captures()
    assert made.stat().st_mode & 0o777 == 0o700
    assert found.source_alive and f"SIGCONT pid {stopped_source.pid}" in found.summary, found
    assert proctree.state(stopped_source.pid) != "T" and not path.exists()


@pytest.mark.parametrize("what", ["journal", "state"])
def test_a_symlinked_journal_dir_is_refused_and_nothing_in_it_is_acted_on(
    tmp_path: Path, stopped_source: Worker, what: str
) -> None:
    """The journal (or the state directory above it) is a symlink to a directory holding a record of a real,
    stopped process: recovery refuses the directory, naming it and the fix, and the process stays stopped."""
    elsewhere = tmp_path / "elsewhere"
    state = tmp_path / "state"
    if what == "journal":
        state.mkdir(mode=0o700)
        (elsewhere).mkdir(mode=0o700)
        (state / "journal").symlink_to(elsewhere)
        target = elsewhere
    else:
        (elsewhere / "journal").mkdir(mode=0o700, parents=True)
        elsewhere.chmod(0o700)
        state.symlink_to(elsewhere)
        target = elsewhere / "journal"
    planted = plant(target, stopped_source.pid)
    executor = EngineExecutor(journal_dir=state / "journal")
    with pytest.raises(UnsafeStateDir) as refused:
        executor.recover_captures()
    message = str(refused.value)
    assert f"{state if what == 'state' else state / 'journal'} is a symlink" in message, message
    assert "Remove" in message and "agent.stateDir" in message and c.ENV_STATE_DIR in message, message
    assert proctree.state(stopped_source.pid) == "T", "the record behind the symlink was not acted on"
    assert planted.exists()
    # a capture never writes its record there either: it fails before it touches its source
    ref = PodRef("ns", "src", "uid-a", "main", "containerd://" + "a" * 64)
    request = CaptureRequest(
        pod=ref, pids=(stopped_source.pid,), root_pid=stopped_source.pid, artifact_dir=tmp_path / "art" / "s",
        node="node-a", content="c-2",
    )  # fmt: skip
    with pytest.raises(ExecutionError) as failed:
        executor.capture(request)
    assert failed.value.reason == c.REASON_CAPTURE_FAILED and "is a symlink" in str(failed.value)
    assert sorted(p.name for p in target.iterdir()) == ["c-1.json"], "no record written through the link"
    assert not (tmp_path / "art" / "s").exists()


def test_a_journal_of_another_owner_or_in_a_dir_others_can_write_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a directory to another uid needs root")
    state = tmp_path / "state"
    (state / "journal").mkdir(parents=True, mode=0o700)
    state.chmod(0o700)
    os.chown(state / "journal", 65534, 65534)
    with pytest.raises(UnsafeStateDir, match="journal is owned by uid 65534"):
        private_dir(state / "journal")
    os.chown(state / "journal", 0, 0)
    state.chmod(0o777)
    with pytest.raises(UnsafeStateDir, match=r"state can be written by others \(mode 0777\)"):
        private_dir(state / "journal")


def test_the_agent_process_refuses_a_symlinked_journal_at_start(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (tmp_path / "elsewhere").mkdir()
    (state / "journal").symlink_to(tmp_path / "elsewhere")
    env = {**os.environ, c.ENV_NODE_NAME: "node-a", c.ENV_STATE_DIR: str(state)}
    got = subprocess.run([str(BIN / "podsnap-agent")], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert got.returncode == 1, got
    assert f"agent state {state / 'journal'} is a symlink" in got.stderr and "agent.stateDir" in got.stderr, got


def test_records_of_the_old_volume_location_are_removed_unread(tmp_path: Path, stopped_source: Worker) -> None:
    artifacts = tmp_path / "artifacts"
    mine, other = artifacts / ".journal" / "node-a", artifacts / ".journal" / "node-b"
    planted = plant(mine, stopped_source.pid)
    plant(other, stopped_source.pid)
    (mine / "link.json").symlink_to(planted)
    assert drop_volume_journal(artifacts, "node-a") == ["c-1.json", "link.json"]
    assert not mine.exists() and other.is_dir(), "another node's agent removes its own"
    assert proctree.state(stopped_source.pid) == "T"
    assert drop_volume_journal(artifacts, "node-b") == ["c-1.json"]
    assert not (artifacts / ".journal").exists() and artifacts.is_dir()
    assert drop_volume_journal(artifacts, "node-a") == [], "reported once"
    # a symlink in place of the node's directory: the link goes, never what it points at
    (artifacts / ".journal").mkdir()
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "x.json").write_text("{}")
    (artifacts / ".journal" / "node-a").symlink_to(keep)
    assert drop_volume_journal(artifacts, "node-a") == ["node-a"]
    assert (keep / "x.json").exists() and not (artifacts / ".journal").exists()
    # ... or in place of .journal itself: the link goes, and nothing below what it points at
    (keep / "node-a").mkdir()
    (keep / "node-a" / "c-9.json").write_text("{}")
    (artifacts / ".journal").symlink_to(keep)
    assert drop_volume_journal(artifacts, "node-a") == [".journal"]
    assert (keep / "node-a" / "c-9.json").exists() and not (artifacts / ".journal").exists()
