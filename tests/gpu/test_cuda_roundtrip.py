"""GPU (the lent H200): capture -> restore of the demo worker holding its weights in CUDA memory.

Bit-exact means: the same exact checksum of every weight on the device, the same greedy tokens and
answer, the same init id and pid, and the SDK in the restored process knows it was restored.
Transparent means the worker does nothing for it: the CUDA checkpoint's host copy of its GPU memory must
leave CRIU's images at capture (`cut`) and come back through the engine's parallel fill.
Run with `PYTHONPATH=python python3 -m pytest -m gpu tests/gpu` (CRIU from PODSNAP_CRIU).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from podsnap.demo import round_trip
from podsnap.engine import Progress
from tests.support.criu import criu_or_skip
from tests.support.processes import free_port

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.fixture(scope="module")
def criu_ready() -> None:
    criu_or_skip()


class PhaseLog:
    """The engine's progress reports: each phase's last one (bytes done, of total)."""

    def __init__(self) -> None:
        self.last: dict[str, Progress] = {}

    def __call__(self, p: Progress) -> None:
        if p.finished:
            self.last[p.phase] = p


def assert_fast_path(log: PhaseLog, gpu_bytes: int) -> None:
    """The GPU memory's host copy left CRIU's images and came back through the parallel fill."""
    cut = log.last.get("cut")
    assert cut is not None, "capture ran no cut phase"
    assert cut.done >= gpu_bytes, (
        f"only {cut.done} bytes left CRIU's images ({cut.total} bytes in large runs, {gpu_bytes} on the GPU): "
        "the CUDA checkpoint's host copy is not in plain anonymous rw mappings"
    )
    fill = log.last.get("fill")
    assert fill is not None and fill.done == cut.done, "the restore did not fill what the capture cut"


def assert_bit_exact(report: dict[str, Any]) -> None:
    before, after = report["before"], report["after"]
    assert after["weights_checksum"] == before["weights_checksum"]
    assert after["tokens"] == before["tokens"]
    assert after["answer"] == before["answer"] == report["restore"]["first_answer"]
    assert after["init_id"] == before["init_id"]
    assert after["pid"] == before["pid"]
    assert after["health"]["restored"] is True
    assert after["health"]["device"].startswith("cuda")
    assert report["capture"]["cuda_pids"], "the capture checkpointed no CUDA process"
    assert report["bit_exact"] and report["same_worker"]


def test_a_float16_worker_comes_back_bit_exact(criu_ready: None, tmp_path: Path) -> None:
    log = PhaseLog()
    report = round_trip(tmp_path, ["--device", "cuda", "--weights-gib", "1"], port=free_port(), engine_progress=log)
    assert_bit_exact(report)
    assert_fast_path(log, 1 << 30)
    assert report["before"]["health"]["weights_bytes"] == 1 << 30
    assert report["gpu_bytes"] is None or report["gpu_bytes"] >= 1 << 30
    (tmp_path / "report.json").write_text(json.dumps(report, indent=1))


def test_a_compiled_bfloat16_worker_comes_back_bit_exact(criu_ready: None, tmp_path: Path) -> None:
    log = PhaseLog()
    report = round_trip(
        tmp_path,
        ["--device", "cuda", "--weights-gib", "0.5", "--dtype", "bfloat16", "--compile"],
        port=free_port(),
        engine_progress=log,
    )
    assert_bit_exact(report)
    assert_fast_path(log, 1 << 29)
    assert report["before"]["health"]["compiled"] is True
    assert report["before"]["health"]["phases_s"]["compile"] > 0


def test_podsnap_demo_cli_on_cuda_keeps_the_answer_and_init_id(criu_ready: None, tmp_path: Path) -> None:
    out = tmp_path / "demo.json"
    p = subprocess.run(
        [sys.executable, "-m", "podsnap.cli", "demo", "--device", "cuda", "--weights-gib", "0.5", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["sameAnswerAndInitId"] is True


def test_in_namespace_mode_the_worker_moves_into_another_pod_bit_exact(criu_ready: None, tmp_path: Path) -> None:
    """As the agent does in pods: the worker in its own PID/mount/UTS/IPC namespaces, captured with CRIU
    inside them, restored into another sandbox's, its GPU memory through the parallel fill."""
    log = PhaseLog()
    report = round_trip(
        tmp_path, ["--device", "cuda", "--weights-gib", "1"], port=free_port(), engine_progress=log, namespaces=True
    )
    assert_bit_exact(report)
    assert report["restore"]["ns_pid"] == report["before"]["pid"] != report["restore"]["pid"], (
        "same namespace PID in the new sandbox, another host PID"
    )
    assert_fast_path(log, 1 << 30)
