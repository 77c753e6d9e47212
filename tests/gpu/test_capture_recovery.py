"""GPU (the lent H200): an agent that dies in the middle of a capture leaves its source CUDA-checkpointed;
the recovery an agent runs when it starts gives the worker its GPU memory back, and it serves its exact
data again (same weights checksum, tokens, answer, init id and pid).

The dying agent is tests/support/dying_capture.py: the engine's real capture with the host's CUDA driver
and real CRIU, killed (its whole process group, CRIU included) after cuCheckpointProcessCheckpoint, or in
the middle of the CRIU dump. The recovery is the engine's own (`recover_capture`), as the agent runs it.

Run: `PODSNAP_CRIU=$PWD/.device/criu/criu.sh PYTHONPATH=$PWD/python python3 -m pytest -m gpu tests/gpu/test_capture_recovery.py -v`
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from podsnap import contract
from podsnap.demo._roundtrip import probe, start_detached, stop_worker
from podsnap.engine import DriverCuda, read_capture_journal, recover_capture
from tests.support.criu import criu_or_skip
from tests.support.processes import free_port
from tests.support.tools import REPO
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.fixture(autouse=True)
def _criu() -> None:
    criu_or_skip()


def _health(port: int) -> bool:
    from podsnap.demo._roundtrip import _request

    try:
        return _request(f"http://127.0.0.1:{port}/health", timeout=5).get("status") == "ok"
    except OSError:
        return False


@pytest.mark.parametrize(("die_at", "weights_gib"), [("checkpoint", "1"), ("criu_dump", "4")])
def test_a_cuda_worker_left_checkpointed_by_a_dead_capture_serves_its_exact_data_after_recovery(
    tmp_path: Path, die_at: str, weights_gib: str
) -> None:
    port = free_port()
    control = tmp_path / "control"
    control.mkdir()
    env = {**os.environ, contract.ENV_CONTROL_DIR: str(control)}
    cmd = [sys.executable, "-m", "podsnap.demo", "--host", "127.0.0.1", "--port", str(port), "--device", "cuda"]
    pid, log = start_detached([*cmd, "--weights-gib", weights_gib], tmp_path, env)
    try:
        wait_for(lambda: _health(port), what=f"the CUDA worker's cold start (log {log})", timeout=600, interval=1)
        before = probe(port)
        journal, out = tmp_path / "journal" / "c-1.json", tmp_path / "artifacts" / "snap"
        dying = subprocess.Popen(
            [sys.executable, "-m", "tests.support.dying_capture", str(pid), str(out), str(journal), "real", die_at],
            cwd=REPO,
            start_new_session=True,
        )
        try:
            if die_at == "checkpoint":
                marker = out.parent / f"{out.name}.hung"
                wait_for(lambda: marker.exists() or dying.poll() is not None, what="the checkpoint", timeout=300)
            else:
                dying.wait(timeout=600)  # it kills itself and its CRIU in the middle of the dump
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(dying.pid, signal.SIGKILL)
            dying.wait(timeout=30)
        record = read_capture_journal(journal)
        driver = DriverCuda()
        assert driver.state(pid) == "CHECKPOINTED", "the dead capture left the worker checkpointed"
        assert not out.exists()

        recovery = recover_capture(record)  # the host's driver, as the agent's recovery uses it

        assert recovery.source_alive and not recovery.problems, recovery.summary()
        assert f"cuCheckpointProcessRestore pid {pid}" in recovery.actions
        assert f"cuCheckpointProcessUnlock pid {pid}" in recovery.actions
        assert driver.state(pid) == "RUNNING"
        wait_for(lambda: _health(port), what="the worker serving again", timeout=60)
        after = probe(port)
        assert after["weights_checksum"] == before["weights_checksum"], "the GPU memory came back bit-exact"
        assert after["tokens"] == before["tokens"] and after["answer"] == before["answer"]
        assert after["init_id"] == before["init_id"] and after["pid"] == before["pid"] == pid
    finally:
        stop_worker(pid)
