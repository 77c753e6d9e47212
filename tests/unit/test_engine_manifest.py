"""Manifest round trip, versioning and validation."""

from __future__ import annotations

import json

import pytest

from podsnap.engine import SCHEMA_VERSION, ArtifactError, FileEntry, GpuInfo, HostFacts, Manifest, ProcInfo
from podsnap.engine._manifest import Extent


def _manifest(digest: str = "sha256") -> Manifest:
    return Manifest(
        digest=digest,
        source=HostFacts(
            "node-a",
            "x86_64",
            "6.1.0-18",
            "glibc 2.36",
            1 << 40,
            1 << 39,
            "580.159.04",
            (GpuInfo(0, "GPU-aaaa", "NVIDIA H200", 141 << 30),),
        ),
        processes=(
            ProcInfo(100, 7, 1, "python", ("python", "-m", "w")),
            ProcInfo(101, 8, 100, "python", ("python", "child")),
        ),
        cuda_pids=(100,),
        cuda_gpu_uuids=("GPU-aaaa",),
        files=(FileEntry("criu/pages-1.img", 10, "ab" * 32), FileEntry("criu/core-7.img", 3, "cd" * 32)),
        namespaced=True,
        criu_version="4.2.1",
        criu_options=("shell-job",),
        timings_ms={"criu_dump": 12.5},
        extra={"weights": {"shards": [{"path": "w/0.bin"}]}},
        created_at="2026-11-30T13:00:00+00:00",
    )


def test_round_trip_keeps_every_field() -> None:
    m = _manifest()
    again = Manifest.from_json(m.to_json())
    assert again == m
    data = json.loads(m.to_json())
    assert data["schema"] == "podsnap.io/artifact" and data["schemaVersion"] == 1, "no bulk: readable by podsnap 1"
    assert "digestAlgorithm" not in data and data["files"][0]["sha256"] == "ab" * 32
    assert data["totals"] == {"files": 2, "bytes": 13, "memoryBytes": 10}
    assert again.root.ns_pid == 7


def test_unknown_keys_are_ignored() -> None:
    data = json.loads(_manifest().to_json())
    data["future"] = {"x": 1}
    data["process"]["newField"] = True
    assert Manifest.from_dict(data) == _manifest()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"schemaVersion": SCHEMA_VERSION + 1}, "newer than this podsnap understands"),
        ({"schemaVersion": "1"}, "'schemaVersion' must be a positive integer"),
        ({"schema": "other"}, "'schema' must be"),
        ({"process": {"tree": []}}, "'process.tree' is empty"),
        ({"files": [{"path": "x", "sha256": "ab"}]}, "malformed manifest"),
        ({"chunkBytes": 1}, "chunkBytes"),
    ],
)
def test_bad_manifests_are_refused_naming_the_field(change: dict[str, object], message: str) -> None:
    data = json.loads(_manifest().to_json())
    data.update(change)
    with pytest.raises(ArtifactError, match=message):
        Manifest.from_dict(data, where="/a/manifest.json")


def test_not_json_is_refused() -> None:
    with pytest.raises(ArtifactError, match="not valid JSON"):
        Manifest.from_json("{", where="m.json")


def test_blake3_digests_make_schema_3_and_name_their_algorithm() -> None:
    m = _manifest("blake3")
    data = json.loads(m.to_json())
    assert data["schemaVersion"] == SCHEMA_VERSION == 3, "an older podsnap must refuse it, not misread it"
    assert data["digestAlgorithm"] == "blake3"
    assert data["files"][0] == {"path": "criu/pages-1.img", "size": 10, "blake3": "ab" * 32}
    assert Manifest.from_json(m.to_json()) == m
    assert Manifest.from_json(_manifest().to_json()).digest == "sha256", "no algorithm named: sha256"
    with_bulk = _with_bulk("blake3")
    assert Manifest.from_json(with_bulk.to_json()) == with_bulk


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(digestAlgorithm="md5"), "'digestAlgorithm' 'md5' is not one this podsnap checks"),
        (lambda d: d.pop("digestAlgorithm"), "'digestAlgorithm' None is not one"),
        (lambda d: d.update(schemaVersion=2), "'digestAlgorithm' needs schemaVersion 3"),
        (lambda d: d["files"][1].pop("blake3"), r"files\[1\] \(criu/core-7.img\) has no 'blake3' digest"),
    ],
)
def test_bad_digest_algorithms_are_refused_naming_the_field(mutate: object, message: str) -> None:
    data = json.loads(_manifest("blake3").to_json())
    mutate(data)  # type: ignore[operator]
    with pytest.raises(ArtifactError, match=message):
        Manifest.from_dict(data, where="/a/manifest.json")


def _with_bulk(digest: str = "sha256") -> Manifest:
    m = _manifest(digest)
    raw = FileEntry("bulk/pages-1.raw", 1 << 22, "ef" * 32)
    extents = (
        Extent(pid=7, vaddr=0x7F0000000000, length=1 << 21, file=raw.path, offset=0),
        Extent(pid=8, vaddr=0x7F0000000000, length=1 << 20, file=raw.path, offset=1 << 21),
    )
    return Manifest(**{**m.__dict__, "files": (*m.files, raw), "bulk": extents})


def test_bulk_extents_make_schema_2_and_round_trip() -> None:
    m = _with_bulk()
    data = json.loads(m.to_json())
    assert data["schemaVersion"] == 2 and SCHEMA_VERSION == 3
    assert data["bulk"]["extents"][1] == {
        "pid": 8,
        "vaddr": 0x7F0000000000,
        "length": 1 << 20,
        "file": "bulk/pages-1.raw",
        "offset": 1 << 21,
    }
    assert Manifest.from_json(m.to_json()) == m
    assert m.memory_bytes == 10 + (3 << 20) and m.bulk_files == ("bulk/pages-1.raw",)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["bulk"]["extents"][0].update(pid=99), "pid 99 is not in process.tree"),
        (lambda d: d["bulk"]["extents"][0].update(file="criu/pages-1.img"), "not a listed file under bulk/"),
        (lambda d: d["bulk"]["extents"][0].update(file="bulk/other.raw"), "not a listed file under bulk/"),
        (lambda d: d["bulk"]["extents"][0].update(vaddr=0x7F0000000001), "page-aligned"),
        (lambda d: d["bulk"]["extents"][0].update(length=0), "length positive"),
        (lambda d: d["bulk"]["extents"][1].update(offset=1 << 22), "beyond the end"),
        (lambda d: d["bulk"]["extents"][1].update(pid=7), "overlap"),
        (lambda d: d["bulk"].update(extents=[]), "needs a non-empty 'bulk.extents'"),
        (lambda d: d.pop("bulk"), "needs a non-empty 'bulk.extents'"),
        (lambda d: d.update(schemaVersion=1), "'bulk' section needs schemaVersion 2"),
        (lambda d: d["bulk"].update(pageSize=65536), "pageSize"),
    ],
)
def test_bad_bulk_sections_are_refused_naming_the_extent(mutate: object, message: str) -> None:
    data = json.loads(_with_bulk().to_json())
    mutate(data)  # type: ignore[operator]
    with pytest.raises(ArtifactError, match=message):
        Manifest.from_dict(data, where="/a/manifest.json")


def test_the_gpus_that_hold_cuda_state_are_what_placement_records() -> None:
    """status.source.cudaGpus (agent/engine_executor.py): one model per GPU the captured processes used, none
    without CUDA state; restore pods are placed by them (podsnap.kube.placement_labels)."""
    from dataclasses import replace

    from podsnap.agent.engine_executor import cuda_gpus

    two = replace(_manifest().source, gpus=(*_manifest().source.gpus, GpuInfo(1, "GPU-bbbb", "NVIDIA L4", 24 << 30)))
    used_one = replace(_manifest(), source=two)
    assert cuda_gpus(used_one) == ["NVIDIA H200"]  # the H200 only: the L4 held no CUDA state
    assert cuda_gpus(replace(used_one, cuda_gpu_uuids=())) == ["NVIDIA H200", "NVIDIA L4"]  # not recorded: all
    assert cuda_gpus(replace(used_one, cuda_pids=())) == []  # a CPU capture needs no GPU
