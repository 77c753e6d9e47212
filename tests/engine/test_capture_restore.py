"""Real CRIU capture -> restore of a live HTTP worker on this host, and every refusal on the way."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from podsnap.engine import (
    ArtifactError,
    CaptureOptions,
    CompatibilityError,
    Criu,
    RestoreOptions,
    capture,
    restore,
)
from podsnap.engine import _proctree as proctree
from tests.support.processes import Worker, http_get

pytestmark = pytest.mark.slow


def test_round_trip_keeps_answer_init_id_memory_and_listening_socket(
    criu: Criu, worker: Worker, tmp_path: Path
) -> None:
    before = worker.get()
    assert before["init_id"] == worker.init_id
    result = capture(worker.pid, tmp_path / "art", criu=criu)
    assert (tmp_path / "art" / "manifest.json").is_file()
    assert result.bytes_total > 0 and result.bytes_memory > 0
    assert {"criu_dump", "hash", "publish", "total"} <= set(result.timings_ms)
    assert not proctree.exists(worker.pid), "CRIU's dump ends the source"
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".")] == [], "no staging dir left behind"

    restored = restore(tmp_path / "art", criu=criu)
    # the same PID comes back on this host, re-parented away from us
    assert restored.pid == worker.pid
    assert proctree.proc_info(restored.pid).ppid != 0
    after = worker.get()  # same port: the listening socket came back
    assert after["init_id"] == before["init_id"]
    assert after["state"] == before["state"]
    assert after["requests"] == before["requests"] + 1, "memory state (request counter) survived"
    assert {"verify", "compat", "criu_restore"} <= set(restored.timings_ms)


def test_restored_process_survives_its_parents_exit(criu: Criu, worker: Worker, tmp_path: Path) -> None:
    capture(worker.pid, tmp_path / "art", criu=criu)
    # restore from a short-lived child process (the CLI); the restored worker must outlive it
    cli = subprocess.run(
        [sys.executable, "-m", "podsnap.cli", "restore", str(tmp_path / "art"), "--json", str(tmp_path / "r.json")],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PODSNAP_CRIU": str(criu.binary.exe)},
    )
    assert cli.returncode == 0, cli.stderr
    pid = json.loads((tmp_path / "r.json").read_text())["pid"]
    assert pid == worker.pid
    assert proctree.is_alive(pid)
    assert worker.get()["init_id"] == worker.init_id


@pytest.fixture
def artifact(criu: Criu, worker: Worker, tmp_path: Path) -> Path:
    """A fresh artifact of `worker` (which is gone afterwards: its PID is free for restores)."""
    capture(worker.pid, tmp_path / "art", criu=criu)
    return tmp_path / "art"


def _biggest_image(art: Path) -> Path:
    return max((art / "criu").glob("pages-*.img"), key=lambda p: p.stat().st_size)


def _assert_not_serving(worker: Worker) -> None:
    assert not proctree.is_alive(worker.pid)
    with pytest.raises(OSError):
        http_get(worker.port, timeout=1)


def test_tampered_image_is_refused_naming_the_file(criu: Criu, worker: Worker, artifact: Path) -> None:
    img = _biggest_image(artifact)
    data = bytearray(img.read_bytes())
    data[len(data) // 2] ^= 0xFF
    img.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="tampered or corrupted") as err:
        restore(artifact, criu=criu)
    assert err.value.path == str(img)
    _assert_not_serving(worker)


def test_truncated_image_is_refused(criu: Criu, worker: Worker, artifact: Path) -> None:
    img = _biggest_image(artifact)
    with img.open("r+b") as f:
        f.truncate(img.stat().st_size - 4096)
    with pytest.raises(ArtifactError, match="truncated") as err:
        restore(artifact, criu=criu)
    assert img.name in str(err.value)
    _assert_not_serving(worker)


def test_unlisted_image_is_refused(criu: Criu, worker: Worker, artifact: Path) -> None:
    (artifact / "criu" / "inventory-extra.img").write_bytes(b"\0")
    with pytest.raises(ArtifactError, match="not listed"):
        restore(artifact, criu=criu)
    _assert_not_serving(worker)


def test_missing_manifest_is_refused(criu: Criu, artifact: Path) -> None:
    (artifact / "manifest.json").unlink()
    with pytest.raises(ArtifactError, match="not a complete artifact"):
        restore(artifact, criu=criu)


@pytest.mark.parametrize(("gate", "field"), [("kernel", "kernel"), ("arch", "arch")])
def test_incompatible_manifest_is_refused_naming_the_gate(
    criu: Criu, worker: Worker, artifact: Path, gate: str, field: str
) -> None:
    manifest = json.loads((artifact / "manifest.json").read_text())
    manifest["source"][field] = "elsewhere-0.0"
    (artifact / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CompatibilityError) as err:
        restore(artifact, criu=criu)
    assert err.value.gate == gate
    assert err.value.expected == "elsewhere-0.0"
    _assert_not_serving(worker)
    # the explicit override restores anyway, and reports what it skipped
    result = restore(artifact, RestoreOptions(skip_compat=True), criu=criu)
    assert [g.gate for g in result.skipped_gates] == [gate]
    assert worker.get()["init_id"] == worker.init_id


def test_memory_gate_names_what_is_needed(criu: Criu, artifact: Path) -> None:
    manifest = json.loads((artifact / "manifest.json").read_text())
    pages = next(f for f in manifest["files"] if f["path"].startswith("criu/pages-"))
    pages["size"] = 1 << 50  # the gate runs on the manifest; make it claim a petabyte of pages
    (artifact / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises((CompatibilityError, ArtifactError)) as err:
        restore(artifact, criu=criu)
    # size mismatch is caught first by verification: the manifest is never trusted over the files
    assert isinstance(err.value, ArtifactError)


def _failing_criu(tmp_path: Path, criu: Criu, action: str) -> Criu:
    """A CRIU wrapper that runs the real CRIU except for `action`, which fails like a broken dump."""
    script = tmp_path / "criu-broken"
    script.write_text(
        f"#!/bin/sh\nif [ \"$1\" = {action} ]; then echo 'Error (injected): {action} refused' >&2; exit 1; fi\n"
        f'LD_LIBRARY_PATH={criu.binary.lib_dir or ""} exec {criu.binary.exe} "$@"\n'
    )
    script.chmod(0o755)
    from podsnap.engine import CriuBinary

    return Criu(CriuBinary(script))


def _no_artifact_visible(parent: Path, name: str) -> None:
    assert not (parent / name).exists()
    assert [p.name for p in parent.iterdir() if name in p.name] == []


def test_injected_criu_failure_leaves_the_source_serving(criu: Criu, worker: Worker, tmp_path: Path) -> None:
    from podsnap.engine import CaptureError

    out = tmp_path / "arts"
    with pytest.raises(CaptureError, match="criu dump exited with 1") as err:
        capture(worker.pid, out / "snap", criu=_failing_criu(tmp_path, criu, "dump"))
    assert err.value.phase == "criu_dump"
    assert "dump refused" in str(err.value)
    assert err.value.source_alive is True
    assert worker.get()["init_id"] == worker.init_id
    _no_artifact_visible(out, "snap")


def test_bad_criu_option_fails_with_the_log_and_leaves_the_source_serving(
    criu: Criu, worker: Worker, tmp_path: Path, node_tmp: Path
) -> None:
    from podsnap.engine import CaptureError, CriuOptions

    logs = tmp_path / "logs"
    opts = CaptureOptions(criu=CriuOptions(extra=("external mnt[]:no-such-mount-key",)), log_dir=logs)
    with pytest.raises(CaptureError) as err:
        capture(worker.pid, tmp_path / "snap", opts, criu=criu)
    assert "Could not add external resource" in str(err.value), "CRIU's own words reach the caller"
    assert "\n" not in str(err.value), "one sentence, no log dump"
    assert err.value.log_path is None, "CRIU wrote no log: none is named"
    assert not logs.exists() or list(logs.iterdir()) == [], "nor copied"
    assert list(node_tmp.iterdir()) == [], "and CRIU's private work dir is gone"
    assert err.value.source_alive is True
    assert worker.get()["init_id"] == worker.init_id
    _no_artifact_visible(tmp_path, "snap")


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "full"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=False, capture_output=True, text=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_leaves_the_source_serving_and_no_artifact(
    criu: Criu, worker: Worker, tiny_tmpfs: Path, tmp_path: Path, node_tmp: Path
) -> None:
    from podsnap.engine import CaptureError

    with pytest.raises(CaptureError) as err:
        capture(worker.pid, tiny_tmpfs / "snap", CaptureOptions(log_dir=tmp_path / "logs"), criu=criu)
    assert "No space left on device" in str(err.value), "CRIU's first error line says why"
    assert "\n" not in str(err.value) and len(str(err.value)) < 600, "a sentence, not the log"
    log = err.value.log_path
    assert log is not None and log.is_file() and log.is_relative_to(tmp_path / "logs"), "the full log is kept"
    assert "No space left on device" in log.read_text(), "a copy of CRIU's own log"
    assert str(log) in str(err.value), "the message says where the log is"
    assert list(node_tmp.iterdir()) == [], "CRIU's private work dir is gone once its log is copied"
    assert err.value.source_alive is True
    assert worker.get()["init_id"] == worker.init_id
    assert list(tiny_tmpfs.iterdir()) == []


def test_existing_destination_is_refused_before_touching_the_source(criu: Criu, worker: Worker, tmp_path: Path) -> None:
    from podsnap.engine import CaptureError

    (tmp_path / "snap").mkdir()
    with pytest.raises(CaptureError, match="already exists"):
        capture(worker.pid, tmp_path / "snap", criu=criu)
    assert worker.get()["init_id"] == worker.init_id


def test_restore_refuses_while_the_pid_is_taken(criu: Criu, worker: Worker, tmp_path: Path) -> None:
    from podsnap.engine import RestoreError

    capture(worker.pid, tmp_path / "art", criu=criu)
    shutil.copytree(tmp_path / "art", tmp_path / "art2")
    restore(tmp_path / "art", criu=criu)
    with pytest.raises(RestoreError, match="already in use"):
        restore(tmp_path / "art2", criu=criu)
    assert worker.get()["init_id"] == worker.init_id


def test_hooks_add_files_to_the_artifact_and_run_before_the_restore(criu: Criu, worker: Worker, tmp_path: Path) -> None:
    def add_rootfs_diff(staging: Path) -> dict[str, object]:
        (staging / "rootfs").mkdir()
        (staging / "rootfs" / "diff.tar").write_bytes(b"tar" * 100)
        return {"rootfsDiff": {"path": "rootfs/diff.tar"}}

    result = capture(worker.pid, tmp_path / "art", CaptureOptions(before_publish=add_rootfs_diff), criu=criu)
    assert result.manifest.extra["rootfsDiff"] == {"path": "rootfs/diff.tar"}
    assert "rootfs/diff.tar" in {f.path for f in result.manifest.files}

    seen: list[str] = []
    (tmp_path / "art" / "rootfs" / "diff.tar").write_bytes(b"TAR" * 100)
    with pytest.raises(ArtifactError, match=r"diff\.tar"):
        restore(tmp_path / "art", RestoreOptions(before_restore=lambda a, m: seen.append("called")), criu=criu)
    assert seen == [], "the hook runs only once the artifact is verified"
    (tmp_path / "art" / "rootfs" / "diff.tar").write_bytes(b"tar" * 100)
    restored = restore(
        tmp_path / "art",
        RestoreOptions(before_restore=lambda a, m: seen.append(m.extra["rootfsDiff"]["path"])),
        criu=criu,
    )
    assert seen == ["rootfs/diff.tar"]
    assert "before_restore" in restored.timings_ms
    assert worker.get()["init_id"] == worker.init_id
