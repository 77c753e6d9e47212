"""GPU (the lent H200): capture -> restore of the demo worker holding its weights in CUDA memory.

Bit-exact means: the same exact checksum of every weight on the device, the same greedy tokens and
answer, the same init id and pid, and the SDK in the restored process knows it was restored.
Run with `PYTHONPATH=python python3 -m pytest -m gpu tests/gpu` (CRIU from PODSNAP_CRIU).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from podsnap.demo._roundtrip import round_trip

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def criu_ready() -> None:
    from podsnap.engine import CriuError, find_binary

    if os.geteuid() != 0:
        pytest.skip("CRIU needs root")
    try:
        find_binary()
    except CriuError as e:
        pytest.skip(f"CRIU unusable: {str(e).splitlines()[0]}")


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
    report = round_trip(tmp_path, ["--device", "cuda", "--weights-gib", "1"], port=free_port())
    assert_bit_exact(report)
    assert report["before"]["health"]["weights_bytes"] == 1 << 30
    assert report["gpu_bytes"] is None or report["gpu_bytes"] >= 1 << 30
    (tmp_path / "report.json").write_text(json.dumps(report, indent=1))


def test_a_compiled_bfloat16_worker_comes_back_bit_exact(criu_ready: None, tmp_path: Path) -> None:
    report = round_trip(
        tmp_path, ["--device", "cuda", "--weights-gib", "0.5", "--dtype", "bfloat16", "--compile"], port=free_port()
    )
    assert_bit_exact(report)
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
