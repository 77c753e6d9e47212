"""GPU (the lent H200): the cooperative weight path of the demo worker through a real capture and restore.

The worker adopts its weights into SDK-owned VMM memory (`--cooperative`), releases the physical GPU
memory before the CUDA checkpoint, and streams the weights back at resume at the same addresses.
Bit-exact means what tests/gpu/test_cuda_roundtrip.py means (same weights checksum, tokens, answer,
init id and pid), plus: the weights came back from where they should (host copy or file), and a
torch.compile(mode="reduce-overhead") decode step, whose CUDA graphs read the adopted tensors at their
addresses, answers the same after the restore.

Run: `PODSNAP_CRIU=$PWD/.device/criu/criu.sh PYTHONPATH=$PWD/python python3 -m pytest -m gpu tests/gpu/test_cooperative.py`
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from podsnap.demo import round_trip
from tests.support.criu import criu_or_skip
from tests.support.processes import free_port

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.fixture(autouse=True)
def _criu() -> None:
    criu_or_skip()


GIB = 1 << 30


def assert_bit_exact(report: dict[str, Any]) -> dict[str, Any]:
    before, after = report["before"], report["after"]
    assert after["weights_checksum"] == before["weights_checksum"]
    assert after["tokens"] == before["tokens"]
    assert after["answer"] == before["answer"] == report["restore"]["first_answer"]
    assert after["init_id"] == before["init_id"] and after["pid"] == before["pid"]
    assert after["health"]["restored"] is True
    assert report["capture"]["cuda_pids"], "the capture checkpointed no CUDA process"
    coop: dict[str, Any] = after["health"]["cooperative"]
    assert coop is not None, "the worker did not run the cooperative path"
    assert coop["reload"]["bytes"] == coop["bytes"] >= before["health"]["weights_bytes"]
    return coop


def write_weights(path: Path, gib: float, dtype: str = "float16") -> None:
    subprocess.run(
        [
            *(sys.executable, "-m", "podsnap.demo", "--device", "cuda", "--write-weights", str(path)),
            *("--weights-gib", str(gib), "--dtype", dtype),
        ],
        check=True,
        timeout=300,
    )


def test_weights_saved_to_host_memory_come_back_bit_exact(tmp_path: Path) -> None:
    report = round_trip(tmp_path, ["--device", "cuda", "--weights-gib", "1", "--cooperative"], port=free_port())
    coop = assert_bit_exact(report)
    assert coop["offload"]["saved_bytes"] == coop["bytes"] and coop["offload"]["file_bytes"] == 0
    assert coop["reload"]["file_bytes"] == 0
    (tmp_path / "report.json").write_text(json.dumps(report, indent=1))


def test_weights_from_a_file_are_not_in_the_checkpoint_and_stream_back_from_it(tmp_path: Path) -> None:
    weights = tmp_path / "weights.bin"
    write_weights(weights, 1)
    report = round_trip(
        tmp_path / "w",
        ["--device", "cuda", "--weights-gib", "1", "--weights-file", str(weights), "--cooperative"],
        port=free_port(),
    )
    coop = assert_bit_exact(report)
    assert coop["offload"]["file_bytes"] >= GIB
    assert coop["offload"]["saved_bytes"] < 1 << 20, "only the small derived tensors may be copied"
    assert coop["reload"]["file_bytes"] >= GIB and coop["reload"]["threads"] > 0
    assert coop["reload"]["repinned"] == [], "the kept staging buffers lost their pinning across the restore"


def test_cuda_graphs_captured_on_adopted_weights_replay_after_the_restore(tmp_path: Path) -> None:
    report = round_trip(
        tmp_path,
        [
            *("--device", "cuda", "--weights-gib", "0.5", "--dtype", "bfloat16", "--cooperative"),
            *("--compile", "--compile-mode", "reduce-overhead"),
        ],
        port=free_port(),
    )
    assert_bit_exact(report)
    health = report["before"]["health"]
    assert health["compiled"] is True and health["compile_mode"] == "reduce-overhead"


def test_in_namespace_mode_the_weights_follow_the_worker_into_another_pod(tmp_path: Path) -> None:
    """As the agent does in pods: captured inside one sandbox's PID/mount namespaces, restored into another's."""
    weights = tmp_path / "weights.bin"
    write_weights(weights, 1)
    report = round_trip(
        tmp_path / "w",
        ["--device", "cuda", "--weights-gib", "1", "--weights-file", str(weights), "--cooperative"],
        port=free_port(),
        namespaces=True,
    )
    coop = assert_bit_exact(report)
    assert report["restore"]["ns_pid"] == report["before"]["pid"] != report["restore"]["pid"]
    assert coop["reload"]["file_bytes"] >= GIB
