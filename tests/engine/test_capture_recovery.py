"""A capture whose process died (an agent killed mid-capture) leaves a journal record; the recovery gives
its source back what the capture took. Real processes and real CRIU; the CUDA driver is the FAKE of
tests/support/fake_cuda.py (no GPU here; tests/gpu/test_capture_recovery.py does it on a real one)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from podsnap.engine import CaptureError, CaptureOptions, Criu, capture, read_capture_journal, recover_capture
from podsnap.engine import _journal as journal  # white-box: records as an older capture wrote them
from tests.support.fake_cuda import CHECKPOINTED, LOCKED, RUNNING, FakeCudaDriver
from tests.support.processes import Worker, http_get
from tests.support.tools import REPO
from tests.support.waiting import wait_for

from .test_capture_restore import _failing_criu

pytestmark = pytest.mark.slow


def dying_capture(pid: int, tmp: Path, die_at: str) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """Start tests/support/dying_capture.py on `pid` in its own session; (its process, journal, artifact)."""
    record, out = tmp / "journal" / "c-1.json", tmp / "artifacts" / "ns" / "snap"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.dying_capture",
            str(pid),
            str(out),
            str(record),
            str(tmp / "cuda"),
            die_at,
        ],
        cwd=REPO,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return proc, record, out


def kill_session(proc: subprocess.Popen[bytes]) -> None:
    """What the container runtime does to an agent container: SIGKILL to all of it (CRIU included)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


@pytest.fixture
def big_worker(tmp_path: Path) -> Iterator[Worker]:
    w = Worker(tmp_path / "worker", bulk_mib=256)  # a dump long enough to be killed in the middle
    yield w
    w.kill()


#: where the dying capture stops -> the fake driver's state it leaves, and the calls that give it back
CASES = {"lock": (LOCKED, ["unlock"]), "checkpoint": (CHECKPOINTED, ["restore", "unlock"])}


@pytest.mark.parametrize("die_at", sorted(CASES))
def test_a_source_a_dead_capture_left_cuda_locked_or_checkpointed_serves_again_after_recovery(
    criu: Criu, worker: Worker, tmp_path: Path, die_at: str
) -> None:
    left, given_back = CASES[die_at]
    driver = FakeCudaDriver(tmp_path / "cuda", [worker.pid])
    proc, record_path, out = dying_capture(worker.pid, tmp_path, die_at)
    try:
        wait_for(lambda: driver.state(worker.pid) == left, what=f"the capture past cuCheckpointProcess {die_at}")
    finally:
        kill_session(proc)
    record = read_capture_journal(record_path)
    assert record.root.pid == worker.pid and record.root.start == journal.start_time(worker.pid)
    assert record.step == {"lock": journal.STEP_CUDA_LOCK, "checkpoint": journal.STEP_CUDA_CHECKPOINT}[die_at]
    assert record.note == {"content": "c-1"} and record.boot == journal.boot_id()
    assert [p.pid for p in record.cuda] == [worker.pid]
    before = len(driver.calls())

    recovery = recover_capture(record, cuda=FakeCudaDriver(tmp_path / "cuda"))

    assert recovery.source_alive and not recovery.problems
    assert [name for name, _ in driver.calls()[before:]] == given_back
    assert driver.state(worker.pid) == RUNNING
    assert "cuCheckpointProcessUnlock" in recovery.summary()
    assert http_get(worker.port)["init_id"] == worker.init_id, "the source serves its own state again"
    assert not out.exists(), "nothing of the dead capture is published"


def test_a_source_whose_capture_died_during_the_criu_dump_is_continued_and_serves(
    criu: Criu, big_worker: Worker, tmp_path: Path
) -> None:
    driver = FakeCudaDriver(tmp_path / "cuda", [big_worker.pid])
    proc, record_path, out = dying_capture(big_worker.pid, tmp_path, "criu_dump")
    try:
        proc.wait(timeout=120)  # it kills its own session, CRIU included, with part of the images written
    finally:
        kill_session(proc)
    record = read_capture_journal(record_path)
    assert record.step == journal.STEP_CRIU_DUMP
    assert driver.state(big_worker.pid) == CHECKPOINTED

    recovery = recover_capture(record, cuda=FakeCudaDriver(tmp_path / "cuda"))

    assert recovery.source_alive and not recovery.problems, recovery.summary()
    assert driver.state(big_worker.pid) == RUNNING
    got = wait_for(lambda: _serves(big_worker), what="the source serving after the recovery", timeout=20)
    assert got["init_id"] == big_worker.init_id
    assert not out.exists()


def _serves(w: Worker) -> dict[str, object] | None:
    try:
        return http_get(w.port, timeout=1)
    except OSError:
        return None


def test_recovery_never_touches_a_process_that_only_reuses_the_pid(tmp_path: Path) -> None:
    """After the source exited its PID may be another process's: the start time tells them apart."""
    other = subprocess.Popen(["sleep", "300"])
    try:
        os.kill(other.pid, signal.SIGSTOP)
        wait_for(lambda: journal.proctree.state(other.pid) == "T", what="the other process stopped")
        start = journal.start_time(other.pid)
        assert start is not None
        driver = FakeCudaDriver(tmp_path / "cuda", [other.pid])
        driver.set_state(other.pid, CHECKPOINTED)
        for stale in (
            journal.Record(  # the same PID, started at another time: another process
                root=journal.Proc(other.pid, start + 1),
                tree=(journal.Proc(other.pid, start + 1),),
                cuda=(journal.Proc(other.pid, start + 1),),
                step=journal.STEP_CRIU_DUMP,
                boot=journal.boot_id(),
            ),
            journal.Record(  # the same PID and start time, in an earlier boot
                root=journal.Proc(other.pid, start),
                tree=(journal.Proc(other.pid, start),),
                cuda=(journal.Proc(other.pid, start),),
                step=journal.STEP_CRIU_DUMP,
                boot="an-earlier-boot",
            ),
        ):
            recovery = recover_capture(stale, cuda=driver)
            assert not recovery.source_alive and recovery.actions == ()
            assert "gone" in recovery.summary()
        assert driver.calls() == [] and driver.state(other.pid) == CHECKPOINTED
        time.sleep(0.2)
        assert journal.proctree.state(other.pid) == "T", "never continued"
    finally:
        other.kill()
        other.wait()


def test_a_capture_that_ends_leaves_no_journal_record(criu: Criu, worker: Worker, tmp_path: Path) -> None:
    record = tmp_path / "journal" / "c-1.json"
    driver = FakeCudaDriver(tmp_path / "cuda", [worker.pid])
    options = CaptureOptions(journal=record, leave_running=True)
    with pytest.raises(CaptureError):
        capture(worker.pid, tmp_path / "a", options, cuda=driver, criu=_failing_criu(tmp_path, criu, "dump"))
    assert not record.exists(), "rolled back: nothing left to recover"
    assert driver.state(worker.pid) == RUNNING
    capture(worker.pid, tmp_path / "b", options, cuda=driver, criu=criu)
    assert not record.exists(), "published: nothing left to recover"
    assert list(record.parent.iterdir()) == [], "no temporary record either"


def test_a_tree_left_stopped_in_the_dump_is_continued_but_not_a_process_stopped_before_the_capture(
    tmp_path: Path,
) -> None:
    """A tracer (CRIU) that dies may leave its tracees in a group stop; a stop that predates the capture is
    not the capture's to undo. The stops here are SIGSTOPs standing in for both."""
    root, before = subprocess.Popen(["sleep", "300"]), subprocess.Popen(["sleep", "300"])
    try:
        os.kill(before.pid, signal.SIGSTOP)
        wait_for(lambda: journal.proctree.state(before.pid) == "T", what="the earlier stop")
        record = journal.Journal(tmp_path / "c-1.json")
        record.begin(root.pid, [root.pid, before.pid], [], leave_running=False)
        record.step(journal.STEP_CRIU_DUMP)
        os.kill(root.pid, signal.SIGSTOP)  # as a tracer dying in the middle of the dump may leave it
        wait_for(lambda: journal.proctree.state(root.pid) == "T", what="the stop in the dump")

        recovery = recover_capture(read_capture_journal(tmp_path / "c-1.json"))

        assert recovery.actions == (f"SIGCONT pid {root.pid}",)
        wait_for(lambda: journal.proctree.state(root.pid) in ("S", "R"), what="the tree continued")
        assert journal.proctree.state(before.pid) == "T", "the earlier stop is kept"
    finally:
        for p in (root, before):
            p.kill()
            p.wait()


def test_a_stopped_tree_runs_again_before_its_cuda_state_is_given_back(tmp_path: Path) -> None:
    """As after a failed dump: the driver's restore works in the target's own threads, so a tree a dead
    tracer left stopped is continued first (locked, it only blocks in CUDA), then restored and unlocked."""
    root = subprocess.Popen(["sleep", "300"])
    try:
        driver = FakeCudaDriver(tmp_path / "cuda", [root.pid])
        record = journal.Journal(tmp_path / "c-2.json")
        record.begin(root.pid, [root.pid], [root.pid], leave_running=False)
        for step, call in ((journal.STEP_CUDA_LOCK, driver.lock), (journal.STEP_CUDA_CHECKPOINT, driver.checkpoint)):
            record.step(step)
            call(root.pid)
        record.step(journal.STEP_CRIU_DUMP)
        os.kill(root.pid, signal.SIGSTOP)
        wait_for(lambda: journal.proctree.state(root.pid) == "T", what="the stop in the dump")

        recovery = recover_capture(read_capture_journal(tmp_path / "c-2.json"), cuda=FakeCudaDriver(tmp_path / "cuda"))

        assert not recovery.problems, recovery.summary()
        assert recovery.actions[0] == f"SIGCONT pid {root.pid}", recovery.actions
        assert [a.split()[0] for a in recovery.actions[1:]] == [
            "cuCheckpointProcessRestore",
            "cuCheckpointProcessUnlock",
        ]
        assert driver.state(root.pid) == RUNNING
    finally:
        root.kill()
        root.wait()
