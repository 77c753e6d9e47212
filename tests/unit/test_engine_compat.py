"""Compatibility gates: each refusal names the gate, what was expected and what was found."""

from __future__ import annotations

import dataclasses

import pytest

from podsnap.engine import CompatibilityError, FileEntry, GpuInfo, HostFacts, Manifest, ProcInfo
from podsnap.engine._compat import MEMORY_MARGIN_BYTES, check, enforce
from podsnap.engine._restore import gpu_pairs

H200 = "NVIDIA H200"
SRC = HostFacts(
    "a",
    "x86_64",
    "6.1.0",
    "glibc 2.36",
    1 << 40,
    1 << 39,
    "580.159.04",
    (GpuInfo(0, "GPU-aa", H200), GpuInfo(1, "GPU-bb", H200)),
)


def _manifest(cuda: bool = True, pages: int = 1 << 30) -> Manifest:
    return Manifest(
        source=SRC,
        processes=(ProcInfo(10, 10, 1, "w", ()),),
        cuda_pids=(10,) if cuda else (),
        cuda_gpu_uuids=("GPU-bb",) if cuda else (),
        files=(FileEntry("criu/pages-1.img", pages, "0" * 64),),
    )


def test_identical_host_passes() -> None:
    assert check(_manifest(), SRC) == []


@pytest.mark.parametrize(
    ("change", "gate"),
    [
        ({"arch": "aarch64"}, "arch"),
        ({"kernel": "6.8.0"}, "kernel"),
        ({"driver_version": "570.1"}, "driver"),
        ({"gpus": ()}, "gpu-count"),
        ({"gpus": (GpuInfo(0, "GPU-cc", "NVIDIA A100"),)}, "gpu-model"),
        ({"mem_available_bytes": 1 << 20}, "memory"),
    ],
)
def test_each_gate_refuses_naming_itself(change: dict[str, object], gate: str) -> None:
    host = dataclasses.replace(SRC, **change)  # type: ignore[arg-type]
    with pytest.raises(CompatibilityError) as err:
        enforce(_manifest(), host)
    assert err.value.gate == gate
    assert gate in str(err.value)
    # the explicit skip lets it through and reports what it skipped
    assert [f.gate for f in enforce(_manifest(), host, skip=True)] == [gate]


def test_gpu_gates_apply_only_when_cuda_state_was_captured() -> None:
    host = dataclasses.replace(SRC, driver_version=None, gpus=())
    assert check(_manifest(cuda=False), host) == []


def test_one_gpu_of_the_same_model_is_enough_for_a_one_gpu_worker() -> None:
    host = dataclasses.replace(SRC, gpus=(GpuInfo(0, "GPU-zz", H200),))
    assert check(_manifest(), host) == []


def test_memory_gate_counts_pages_plus_margin() -> None:
    m = _manifest(pages=1 << 30)
    ok = dataclasses.replace(SRC, mem_available_bytes=(1 << 30) + MEMORY_MARGIN_BYTES)
    short = dataclasses.replace(SRC, mem_available_bytes=(1 << 30) + MEMORY_MARGIN_BYTES - 1)
    assert check(m, ok) == []
    assert [f.gate for f in check(m, short)] == ["memory"]


def test_gpu_pairs_keep_present_uuids_and_map_others_by_index() -> None:
    m = _manifest()
    assert gpu_pairs(m, SRC, None) == []
    other = dataclasses.replace(SRC, gpus=(GpuInfo(0, "GPU-x0", H200), GpuInfo(1, "GPU-x1", H200)))
    assert gpu_pairs(m, other, None) == [("GPU-bb", "GPU-x0")]
    assert gpu_pairs(m, other, {"GPU-bb": "GPU-x1"}) == [("GPU-bb", "GPU-x1")]


def test_memory_limit_gate_applies_when_the_caller_knows_the_limit() -> None:
    m = _manifest(pages=1 << 30)
    assert check(m, SRC) == []
    assert [f.gate for f in check(m, SRC, memory_limit_bytes=1 << 29)] == ["memory-limit"]
    assert check(m, SRC, memory_limit_bytes=2 << 30) == []
