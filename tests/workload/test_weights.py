"""The cooperative weight path on the named stand-in device (`HostMemoryDevice`: this process's own memory,
numpy arrays, a FIFO copy thread per stream). The GPU side is tests/gpu/test_cooperative.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from podsnap import contract
from podsnap.workload import FileSource, SnapshotControl, Weights, WeightsError, WeightSourceError
from podsnap.workload._devices import HostMemoryDevice, slow_copy

MIB = 1 << 20


def pattern(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1 << 16, n, dtype=np.uint16).view(np.float16)


def same(x: np.ndarray, y: np.ndarray) -> bool:
    """Bit-exact (random float16 bits include NaNs, which never compare equal as floats)."""
    return x.shape == y.shape and x.tobytes() == y.tobytes()


def small(device: HostMemoryDevice | None = None, **kw: int) -> Weights:
    opts = {"threads": 3, "staging_bytes": 64 << 10, "copy_chunk_bytes": 96 << 10, "segment_bytes": 64 * MIB, **kw}
    return Weights(device=device or HostMemoryDevice(), **opts)


def protection(addr: int) -> str:
    for line in Path("/proc/self/maps").read_text().splitlines():
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if lo <= addr < hi:
            return line.split()[1]
    raise AssertionError(f"{addr:#x} is not mapped at all")


def write(path: Path, *arrays: np.ndarray, head: int = 0) -> Path:
    with path.open("wb") as f:
        f.write(b"\xab" * head)
        for a in arrays:
            f.write(a.tobytes())
    return path


def test_file_sources_are_read_by_one_thread_per_core_up_to_16_unless_told() -> None:
    assert Weights(device=HostMemoryDevice()).threads == max(1, min(16, os.cpu_count() or 1))
    assert Weights(device=HostMemoryDevice(), threads=3).threads == 3
    with pytest.raises(ValueError, match="threads and streams must be >= 1"):
        Weights(device=HostMemoryDevice(), threads=0)


def test_saved_weights_leave_the_memory_and_come_back_bit_exact_at_the_same_address() -> None:
    w = small()
    a, b = pattern(300_001, 1), pattern(5, 2)
    ta, tb = w.adopt("a", a), w.adopt("b", b)
    assert same(ta, a) and same(tb, b)
    addr = ta.ctypes.data
    assert addr % 512 == 0 and tb.ctypes.data % 512 == 0
    stats = w.offload()
    assert not w.resident
    assert stats["saved_bytes"] == a.nbytes + b.nbytes and stats["file_bytes"] == 0
    assert protection(addr) == "---p", "the released range must hold no memory"
    back = w.reload()
    assert w.resident and protection(addr).startswith("rw")
    assert ta.ctypes.data == addr
    assert same(ta, a) and np.array_equal(tb.view(np.uint16), b.view(np.uint16))
    assert back["saved_bytes"] == a.nbytes + b.nbytes and back["threads"] == 0
    assert w.offload()["saved_bytes"] == a.nbytes + b.nbytes  # a second round trip
    w.reload()
    assert same(ta, a)


def test_file_weights_are_not_copied_at_offload_and_stream_back_from_the_file(tmp_path: Path) -> None:
    a, b = pattern(700_000, 3), pattern(123_457, 4)
    f = write(tmp_path / "w.bin", a, b, head=4096)
    w = small()
    ta = w.adopt("a", a, source=FileSource(f, 4096))
    tb = w.adopt("b", b, source=FileSource(f, 4096 + a.nbytes))
    stats = w.offload()
    assert stats["saved_bytes"] == 0 and stats["file_bytes"] == a.nbytes + b.nbytes
    back = w.reload()
    assert back["file_bytes"] == a.nbytes + b.nbytes and back["threads"] == 3
    assert same(ta, a) and np.array_equal(tb.view(np.uint16), b.view(np.uint16))


def test_a_staging_buffer_is_refilled_only_after_its_copy_finished(tmp_path: Path) -> None:
    # slow stand-in copies: a thread that reused a buffer before its copy ran would copy the wrong bytes
    a = pattern(400_000, 5)
    f = write(tmp_path / "w.bin", a)
    w = small(HostMemoryDevice(copy=slow_copy(0.005)), threads=2, staging_bytes=16 << 10)
    ta = w.adopt("a", a, source=FileSource(f), verify_source=False)
    w.offload()
    w.reload()
    assert same(ta, a)


def test_a_file_changed_before_the_offload_is_saved_instead(tmp_path: Path) -> None:
    a = pattern(50_000, 6)
    f = write(tmp_path / "w.bin", a)
    w = small()
    ta = w.adopt("a", a, source=FileSource(f))
    write(f, pattern(50_000, 7))  # same size, new content and mtime
    os.utime(f, ns=(1, 1))
    stats = w.offload()
    assert stats["changed_sources"] == ["a"] and stats["saved_bytes"] == a.nbytes
    w.reload()
    assert same(ta, a)


def test_a_file_changed_after_the_offload_is_refused_before_anything_is_mapped(tmp_path: Path) -> None:
    a = pattern(50_000, 8)
    f = write(tmp_path / "weights.bin", a)
    w = small()
    ta = w.adopt("layer.0.weight", a, source=FileSource(f))
    w.offload()
    write(f, a, a)  # grew
    with pytest.raises(WeightSourceError, match=r"'layer.0.weight'.*weights.bin changed since the capture \(size"):
        w.reload()
    assert not w.resident and protection(ta.ctypes.data) == "---p"
    f.unlink()
    with pytest.raises(WeightSourceError, match=r"'layer.0.weight'.*weights.bin is gone on this node"):
        w.reload()


def test_a_source_that_does_not_hold_the_tensor_is_refused_at_adopt(tmp_path: Path) -> None:
    a = pattern(100_000, 9)
    other = a.copy()
    other[70_000] += 1
    f = write(tmp_path / "w.bin", other)
    w = small()
    with pytest.raises(WeightSourceError, match=r"weight 'a' differs from .*w.bin \(first different chunk at byte"):
        w.adopt("a", a, source=FileSource(f))
    with pytest.raises(WeightSourceError, match=r"'a' \(200000 bytes at offset 8\) does not fit"):
        w.adopt("a", a, source=FileSource(f, 8))
    with pytest.raises(WeightSourceError, match="cannot be read"):
        w.adopt("a", a, source=FileSource(tmp_path / "missing"))
    assert w.names == []


def test_adopt_refuses_what_it_cannot_keep() -> None:
    w = small()
    with pytest.raises(WeightsError, match="not contiguous"):
        w.adopt("t", pattern(100, 1).reshape(10, 10).T)
    with pytest.raises(WeightsError, match="empty"):
        w.adopt("e", np.zeros(0, np.float16))
    w.adopt("x", pattern(10, 1))
    with pytest.raises(WeightsError, match="'x' is adopted already"):
        w.adopt("x", pattern(10, 1))
    with pytest.raises(WeightsError, match="not an array of the host device"):
        w.adopt("l", [1, 2, 3])
    w.offload()
    with pytest.raises(WeightsError, match="while the weights are offloaded"):
        w.adopt("y", pattern(10, 1))
    with pytest.raises(WeightsError, match="torch CUDA tensor is needed"):
        Weights().adopt("l", [1, 2, 3])


def test_lost_pinning_is_restored_before_copying() -> None:
    dev = HostMemoryDevice()
    w = small(dev)
    a = pattern(10_000, 11)
    ta = w.adopt("a", a)
    w.offload()
    dev.pinned.clear()  # stand-in for a driver that no longer knows the host copy after the restore
    assert w.reload()["repinned"] == ["host copy"]
    assert same(ta, a)


def test_attached_to_snapshot_control_offload_is_the_last_quiesce_and_reload_precedes_later_resume_hooks(
    tmp_path: Path,
) -> None:
    a = pattern(200_000, 12)
    f = write(tmp_path / "w.bin", a)
    w = small()
    ta = w.adopt("a", a, source=FileSource(f))
    tb = w.adopt("b", pattern(1000, 13))
    control = tmp_path / "control"
    control.mkdir()
    snap = SnapshotControl(control, poll_interval_s=0.01)
    seen: dict[str, object] = {}
    snap.on_quiesce(lambda: seen.setdefault("resident_at_quiesce", w.resident), name="stop-generation")
    w.attach(snap)
    snap.on_resume(lambda info: seen.setdefault("exact_at_resume", same(ta, a)), name="serve")
    result: dict[str, object] = {}
    t = threading.Thread(target=lambda: result.setdefault("info", snap.checkpoint_and_wait(timeout_s=30)))
    t.start()
    try:
        ready = control / contract.FILE_READY_FOR_SNAPSHOT
        while not ready.exists():
            assert t.is_alive()
            t.join(0.01)
        assert not w.resident, "ready-for-snapshot was written before the weights were released"
    finally:
        (control / contract.FILE_RESTORE_COMPLETE).write_text("")
        t.join(30)
    assert seen == {"resident_at_quiesce": True, "exact_at_resume": True}
    assert list(result["info"].hook_seconds) == ["podsnap.weights.reload", "serve"]  # type: ignore[attr-defined]
    assert w.resident and same(tb, pattern(1000, 13))


def test_importing_the_sdk_loads_neither_torch_nor_cuda() -> None:
    code = "import sys, podsnap.workload; print([m for m in ('torch', 'cuda', 'numpy') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out.replace("'", '"')) == []
