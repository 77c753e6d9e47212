"""The demo worker's snapshot point: the SDK protocol in-process (no CRIU), then a real CRIU round trip."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import numpy as np
import pytest

from podsnap import contract
from podsnap.demo import round_trip
from podsnap.demo._model import element_count
from podsnap.engine import Criu

from .conftest import start_worker


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_worker_serves_while_offered_and_applies_the_context_when_released(tmp_path: Path) -> None:
    control = tmp_path / "control"
    control.mkdir()
    env = {**os.environ, contract.ENV_CONTROL_DIR: str(control)}
    w = start_worker(tmp_path, ["--device", "cpu"], env=env)
    try:
        deadline = time.monotonic() + 20
        while not (control / contract.FILE_READY_FOR_SNAPSHOT).exists():
            assert time.monotonic() < deadline, w.log.read_text()
            time.sleep(0.02)
        assert json.loads((control / contract.FILE_READY_FOR_SNAPSHOT).read_text())["pid"] == w.pid
        # still answering while it waits for the capture: `podsnap demo` asks its question here
        answer = w.chat("hello")["choices"][0]["message"]["content"]
        assert w.get("/health")[1]["restore"] is None
        (control / contract.FILE_RESTORE_CONTEXT).write_text(
            contract.RestoreContext(env={"POD_IP": "10.1.2.3"}).to_json()
        )
        (control / contract.FILE_RESTORE_COMPLETE).write_text("")
        while w.get("/health")[1]["restore"] is None:
            assert time.monotonic() < deadline + 10, w.log.read_text()
            time.sleep(0.02)
        health = w.get("/health")[1]
        assert health["restore"]["context_env"] == ["POD_IP"]
        # the same process was released, not restored
        assert health["restored"] is False
        assert w.chat("hello")["choices"][0]["message"]["content"] == answer
        assert '"restored": false' in w.log.read_text()
    finally:
        assert w.stop() == 0


@pytest.mark.slow
def test_a_criu_round_trip_keeps_answer_weights_and_init_id_and_the_sdk_knows_it_was_restored(
    criu: Criu, tmp_path: Path
) -> None:
    report = round_trip(tmp_path, ["--device", "cpu"], port=free_port(), cached_restore=True)
    assert report["bit_exact"], report
    assert report["same_worker"], report
    assert report["after"]["health"]["restored"] is True
    assert report["after"]["health"]["restore"]["context_env"] == ["POD_IP", "POD_NAME"]
    assert report["after"]["init_id"] == report["before"]["init_id"]
    # the second restore of the same artifact, as from a verified node-local cache: nothing hashed again
    cached = report["cached"]
    assert cached["bit_exact"] and cached["same_worker"], cached
    assert cached["after"]["health"]["restored"] is True
    assert "verify" in report["restore"]["phase_bytes"] and "verify" not in cached["restore"]["phase_bytes"]


def test_a_bad_restore_context_stops_the_worker_instead_of_serving(tmp_path: Path) -> None:
    control = tmp_path / "control"
    control.mkdir()
    w = start_worker(tmp_path, ["--device", "cpu"], env={**os.environ, contract.ENV_CONTROL_DIR: str(control)})
    deadline = time.monotonic() + 20
    while not (control / contract.FILE_READY_FOR_SNAPSHOT).exists():
        assert time.monotonic() < deadline, w.log.read_text()
        time.sleep(0.02)
    (control / contract.FILE_RESTORE_CONTEXT).write_text('{"version": 1, "env": {"PORT": 8000}}')
    (control / contract.FILE_RESTORE_COMPLETE).write_text("")
    assert w.proc.wait(timeout=20) == 3
    assert "resume failed, exiting" in w.log.read_text()
    assert "'env' must map strings to strings" in w.log.read_text()


def test_a_snapshot_timeout_leaves_the_source_serving(tmp_path: Path) -> None:
    control = tmp_path / "control"
    control.mkdir()
    env = {**os.environ, contract.ENV_CONTROL_DIR: str(control)}
    w = start_worker(tmp_path, ["--device", "cpu", "--snapshot-timeout", "0.3"], env=env)
    try:
        deadline = time.monotonic() + 20
        while "not captured, serving on" not in w.log.read_text():
            assert time.monotonic() < deadline, w.log.read_text()
            time.sleep(0.05)
        assert w.chat("still there?")["podsnap"]["init_id"] == w.init_id
    finally:
        assert w.stop() == 0


@pytest.mark.slow
@pytest.mark.parametrize("source", ["host", "file"])
def test_a_cooperative_worker_releases_its_weights_before_the_capture_and_gets_them_back(
    criu: Criu, tmp_path: Path, source: str
) -> None:
    """--cooperative on the CPU: the SDK's stand-in device is the process's own memory, so the released
    weights really leave the CRIU image (file source) and come back bit-exact after a real restore."""
    gib = 0.125
    args = ["--device", "cpu", "--weights-gib", str(gib), "--cooperative", "--cooperative-source", source]
    if source == "file":
        weights = tmp_path / "weights.bin"
        weights.write_bytes(np.random.default_rng(7).integers(0, 255, element_count(gib) * 2, dtype=np.uint8))
        args += ["--weights-file", str(weights)]
    report = round_trip(tmp_path / "w", args, port=free_port())
    assert report["bit_exact"] and report["same_worker"], report
    coop = report["after"]["health"]["cooperative"]
    nbytes = report["before"]["health"]["weights_bytes"]
    assert coop["bytes"] >= nbytes
    assert coop["reload"]["bytes"] == coop["bytes"]
    if source == "file":
        assert coop["offload"]["file_bytes"] >= nbytes and coop["reload"]["file_bytes"] >= nbytes
        # the weights were not in the process when it was dumped
        assert report["capture"]["bytes_memory"] < nbytes, report["capture"]
    else:
        assert coop["offload"]["saved_bytes"] == coop["bytes"] and coop["reload"]["file_bytes"] == 0
    assert report["after"]["health"]["phases_s"]["adopt"] > 0


@pytest.mark.slow
def test_a_cooperative_worker_moves_between_pod_like_sandboxes(criu: Criu, tmp_path: Path) -> None:
    """Namespace mode, as the agent does in pods: captured inside one sandbox's namespaces, restored into
    another's, with its weights released before the capture and streamed back from the file."""
    gib = 1 / 64
    weights = tmp_path / "weights.bin"
    weights.write_bytes(np.random.default_rng(8).integers(0, 255, element_count(gib) * 2, dtype=np.uint8))
    args = ["--device", "cpu", "--weights-gib", str(gib), "--weights-file", str(weights), "--cooperative"]
    report = round_trip(tmp_path / "w", args, port=free_port(), namespaces=True)
    assert report["namespaces"] is True
    assert report["bit_exact"] and report["same_worker"], report
    assert report["restore"]["ns_pid"] == report["before"]["pid"] != report["restore"]["pid"]
    assert report["after"]["health"]["cooperative"]["reload"]["file_bytes"] > 0
