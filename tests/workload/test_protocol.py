"""The control-dir protocol, with a real worker thread on one side and the test as the agent on the other."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from podsnap import contract
from podsnap.controldir import ControlDir
from podsnap.workload import (
    ControlDirError,
    QuiesceError,
    RestoreContextError,
    RestoreTimeout,
    ResumeError,
    ResumeInfo,
    SnapshotControl,
    control_dir_from_env,
)


def wait_for(path: Path, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


class Polls:
    """Counts the worker's polls for restore-complete, so a test can wait for "it looked N times and kept
    waiting" instead of sleeping a fixed time (which proves nothing on a slow machine)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = ControlDir.exists

        def counting(ctl: ControlDir, name: str) -> bool:
            if name == contract.FILE_RESTORE_COMPLETE:
                self.count += 1
            return real(ctl, name)

        monkeypatch.setattr(ControlDir, "exists", counting)

    def wait(self, n: int = 5, timeout: float = 5.0) -> None:
        start = self.count
        deadline = time.monotonic() + timeout
        while self.count < start + n:
            assert time.monotonic() < deadline, f"the worker polled {self.count - start} times in {timeout:g} s"
            time.sleep(0.005)


@pytest.fixture
def polls(monkeypatch: pytest.MonkeyPatch) -> Polls:
    return Polls(monkeypatch)


class Worker(threading.Thread):
    """Runs checkpoint_and_wait() in a thread, as a worker's main loop would."""

    def __init__(self, snap: SnapshotControl, timeout_s: float | None = 10.0) -> None:
        super().__init__(daemon=True)
        self.snap = snap
        self.timeout_s = timeout_s
        self.info: ResumeInfo | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.info = self.snap.checkpoint_and_wait(timeout_s=self.timeout_s)
        except BaseException as e:
            self.error = e


@pytest.fixture
def control(tmp_path: Path) -> Path:
    d = tmp_path / "snapshot-control"
    d.mkdir()
    return d


def test_without_a_control_dir_it_is_a_plain_cold_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(contract.ENV_CONTROL_DIR, raising=False)
    monkeypatch.delenv(contract.ENV_CONTROL_DIR_DYNAMO, raising=False)
    snap = SnapshotControl()
    calls: list[str] = []
    snap.on_quiesce(lambda: calls.append("q"))
    snap.on_resume(lambda info: calls.append("r"))
    assert not snap.enabled
    info = snap.checkpoint_and_wait(timeout_s=0.01)
    assert info.restored is False
    assert calls == []


def test_ready_is_written_after_every_quiesce_hook_then_resume_hooks_run_in_order(
    polls: Polls, control: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POD_IP", "10.0.0.1")
    ready = control / contract.FILE_READY_FOR_SNAPSHOT
    events: list[str] = []
    snap = SnapshotControl(control, poll_interval_s=0.01)

    @snap.on_quiesce
    def stop_generation() -> None:
        assert not ready.exists(), "ready-for-snapshot written before quiesce finished"
        events.append("stop")

    snap.on_quiesce(lambda: events.append("free-cache"), name="free-cache")
    snap.on_resume(lambda info: events.append(f"reload:{os.environ['POD_IP']}"), name="reload")
    snap.on_resume(lambda info: events.append(f"reconnect:{info.context.env['POD_NAME']}"), name="reconnect")

    worker = Worker(snap)
    worker.start()
    wait_for(ready)
    assert events == ["stop", "free-cache"]
    body = json.loads(ready.read_text())
    assert body["pid"] == os.getpid()
    # no temporary file is left next to it: the write was a rename
    assert sorted(p.name for p in control.iterdir()) == [contract.FILE_READY_FOR_SNAPSHOT]
    polls.wait()
    assert worker.is_alive(), "returned before restore-complete"

    ctx = contract.RestoreContext(env={"POD_IP": "10.0.0.99", "POD_NAME": "worker-7"})
    (control / contract.FILE_RESTORE_CONTEXT).write_text(ctx.to_json())
    (control / contract.FILE_RESTORE_COMPLETE).write_text("")
    worker.join(5)
    assert worker.error is None
    assert worker.info is not None
    assert events == ["stop", "free-cache", "reload:10.0.0.99", "reconnect:worker-7"]
    assert os.environ["POD_IP"] == "10.0.0.99"
    assert worker.info.context == ctx
    assert list(worker.info.hook_seconds) == ["reload", "reconnect"]
    # same process, never checkpointed: the source was released, not restored
    assert worker.info.restored is False


def test_a_stale_restore_complete_does_not_end_the_wait(polls: Polls, control: Path) -> None:
    (control / contract.FILE_RESTORE_COMPLETE).write_text("")
    (control / contract.FILE_RESTORE_CONTEXT).write_text('{"version": 1, "env": {"OLD": "1"}}')
    worker = Worker(SnapshotControl(control, poll_interval_s=0.01))
    worker.start()
    wait_for(control / contract.FILE_READY_FOR_SNAPSHOT)
    polls.wait()
    assert worker.is_alive()
    (control / contract.FILE_RESTORE_COMPLETE).write_text("")
    worker.join(5)
    assert worker.info is not None
    assert worker.info.context.env == {}


def test_timeout_names_the_missing_file(control: Path) -> None:
    snap = SnapshotControl(control, poll_interval_s=0.01)
    t0 = time.monotonic()
    with pytest.raises(RestoreTimeout, match=contract.FILE_RESTORE_COMPLETE):
        snap.checkpoint_and_wait(timeout_s=0.2)
    assert 0.2 <= time.monotonic() - t0 < 3
    assert (control / contract.FILE_READY_FOR_SNAPSHOT).exists()


def test_a_failing_quiesce_hook_never_offers_the_process(control: Path) -> None:
    snap = SnapshotControl(control)

    def close_sockets() -> None:
        raise OSError("socket busy")

    snap.on_quiesce(close_sockets)
    with pytest.raises(QuiesceError, match="close_sockets") as err:
        snap.checkpoint_and_wait(timeout_s=1)
    assert err.value.hook.endswith("close_sockets")
    assert not (control / contract.FILE_READY_FOR_SNAPSHOT).exists()


def test_a_failing_resume_hook_is_reported_by_name(control: Path) -> None:
    snap = SnapshotControl(control, poll_interval_s=0.01)

    def stream_weights(info: ResumeInfo) -> None:
        raise RuntimeError("out of memory")

    snap.on_resume(stream_weights, name="stream-weights")
    (control / "unused").write_text("")
    worker = Worker(snap)
    worker.start()
    wait_for(control / contract.FILE_READY_FOR_SNAPSHOT)
    (control / contract.FILE_RESTORE_COMPLETE).write_text("")
    worker.join(5)
    assert isinstance(worker.error, ResumeError)
    assert "stream-weights" in str(worker.error)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("{not json", "not valid JSON"),
        ('{"version": "one", "env": {}}', "'version'"),
        ('{"version": 1, "env": {"PORT": 8000}}', "'env'"),
        ('{"version": 1, "env": ["A=1"]}', "'env'"),
    ],
)
def test_a_bad_restore_context_is_rejected_naming_the_field(control: Path, text: str, field: str) -> None:
    snap = SnapshotControl(control, poll_interval_s=0.01)
    resumed: list[ResumeInfo] = []
    snap.on_resume(resumed.append)
    worker = Worker(snap)
    worker.start()
    wait_for(control / contract.FILE_READY_FOR_SNAPSHOT)
    (control / contract.FILE_RESTORE_CONTEXT).write_text(text)
    (control / contract.FILE_RESTORE_COMPLETE).write_text("")
    worker.join(5)
    assert isinstance(worker.error, RestoreContextError)
    assert field in str(worker.error)
    assert contract.FILE_RESTORE_CONTEXT in str(worker.error)
    assert resumed == [], "resume hooks ran on a context that was rejected"


def test_control_dir_env_names_podsnap_first_then_dynamo(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    assert control_dir_from_env({}) is None
    assert control_dir_from_env({contract.ENV_CONTROL_DIR: ""}) is None
    assert control_dir_from_env({contract.ENV_CONTROL_DIR_DYNAMO: str(b)}) == b
    assert control_dir_from_env({contract.ENV_CONTROL_DIR: str(a), contract.ENV_CONTROL_DIR_DYNAMO: str(b)}) == a


def test_dynamo_variable_alone_drives_the_protocol(control: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(contract.ENV_CONTROL_DIR, raising=False)
    monkeypatch.setenv(contract.ENV_CONTROL_DIR_DYNAMO, str(control))
    snap = SnapshotControl(poll_interval_s=0.01)
    assert snap.control_dir == control
    worker = Worker(snap)
    worker.start()
    wait_for(control / contract.FILE_READY_FOR_SNAPSHOT)
    (control / contract.FILE_RESTORE_COMPLETE).write_text("")
    worker.join(5)
    assert worker.error is None


def test_a_control_dir_that_does_not_exist_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ControlDirError, match=f"{contract.ENV_CONTROL_DIR}={missing}: not a directory"):
        SnapshotControl(environ={contract.ENV_CONTROL_DIR: str(missing)})


def test_a_frozen_gap_does_not_count_toward_the_timeout(
    polls: Polls, control: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A capture freezes the process; after the restore the clock has jumped. That jump is not waiting."""
    real = time.monotonic
    jump = {"offset": 0.0}
    monkeypatch.setattr(time, "monotonic", lambda: real() + jump["offset"])
    snap = SnapshotControl(control, poll_interval_s=0.01)
    worker = Worker(snap, timeout_s=2.0)
    worker.start()
    wait_for(control / contract.FILE_READY_FOR_SNAPSHOT)
    jump["offset"] = 3600.0
    polls.wait()
    (control / contract.FILE_RESTORE_COMPLETE).write_text("")
    worker.join(5)
    assert worker.error is None
    assert worker.info is not None
    assert worker.info.waited_s < 2.0
