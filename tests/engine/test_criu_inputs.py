"""CRIU reads only private, verified inputs (security finding 3 of the 2026-12-02 review): an artifact is on a
volume others may write, so what CRIU reads at a restore (its images, its config) must be neither read from
the volume after it was verified nor left where another writer can change it. Real CRIU, real processes;
the attacks run through the engine's own seams (`before_restore`, `before_publish`, progress callbacks).
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from podsnap.engine import (
    ArtifactError,
    CaptureError,
    CaptureOptions,
    Criu,
    CriuBinary,
    Manifest,
    Progress,
    RestoreError,
    RestoreOptions,
    _digest,
    capture,
    read_manifest,
    restore,
)
from tests.support.processes import Worker

pytestmark = pytest.mark.slow


def _children() -> list[int]:
    out: list[int] = []
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            out += [int(p) for p in (task / "children").read_text().split()]
    return out


class CriuArgs:
    """A progress callback that records the command line of the CRIU this process runs, and the dirs it
    names (-D, -W), while it runs."""

    def __init__(self, exe: Path) -> None:
        self.exe = exe.resolve()
        self.seen: list[list[str]] = []
        self.dirs: dict[str, os.stat_result] = {}

    def __call__(self, p: Progress) -> None:
        if p.phase not in ("criu_restore", "criu_dump") or p.finished:
            return
        for pid in _children():
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/exe").resolve() == self.exe:
                    args = Path(f"/proc/{pid}/cmdline").read_text().split("\0")[:-1]
                    self.seen.append(args)
                    for flag in ("-D", "-W"):
                        self.dirs.setdefault(flag, os.lstat(args[args.index(flag) + 1]))

    def arg(self, flag: str) -> Path:
        assert self.seen, "CRIU was seen running"
        args = self.seen[0]
        return Path(args[args.index(flag) + 1])

    def private(self, flag: str, node_tmp: Path) -> Path:
        """The dir CRIU was given with `flag`: a fresh dir of ours in the node's temp dir nobody else may enter."""
        path, st = self.arg(flag), self.dirs[flag]
        assert path.parent == node_tmp, f"{path} is a fresh dir in the system temp dir"
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
        return path


def _forge(path: Path) -> bytes:
    """Overwrite `path` with other bytes of the same size (what a second NFS client, or a server answering
    a second read differently, can do); return them."""
    forged = bytes(b ^ 0x5A for b in path.read_bytes())
    path.write_bytes(forged)
    return forged


def test_a_core_image_forged_after_verify_never_reaches_criu(
    criu: Criu, worker: Worker, tmp_path: Path, node_tmp: Path
) -> None:
    before = worker.get()
    cap = capture(worker.pid, tmp_path / "art", criu=criu)
    art = tmp_path / "art"
    forged: dict[str, bytes] = {}

    def swap(artifact: Path, manifest: Manifest) -> None:
        # after every digest was checked, before CRIU starts: the creds and capabilities CRIU would
        # give the process live in core-N.img; the process tree and files in pstree.img and files.img
        for f in manifest.files:
            name = Path(f.path).name
            if name.startswith("core-") or name in ("pstree.img", "files.img"):
                forged[f.path] = _forge(artifact / f.path)

    seen = CriuArgs(criu.binary.exe)
    restored = restore(
        art,
        RestoreOptions(expected_manifest_digest=cap.manifest_digest, before_restore=swap),
        criu=criu,
        progress=seen,
    )
    assert forged and all((art / rel).read_bytes() == data for rel, data in forged.items()), "the volume is forged"
    after = worker.get()
    assert restored.pid == worker.pid and after["init_id"] == before["init_id"], "the process CRIU verified came back"
    assert after["requests"] == before["requests"] + 1
    images = seen.private("-D", node_tmp)
    assert not images.is_relative_to(art), "CRIU read a copy, not the artifact"
    assert list(node_tmp.iterdir()) == [], "the copy and the work dir are gone afterwards"
    # the same forgery before the verify is refused, naming the file
    worker.kill()
    with pytest.raises(ArtifactError, match=r"core-[0-9]+\.img: .* differs from the manifest's"):
        restore(art, RestoreOptions(expected_manifest_digest=cap.manifest_digest), criu=criu)


def test_images_are_read_once_so_a_volume_that_answers_differently_later_changes_nothing(
    criu: Criu, worker: Worker, tmp_path: Path, node_tmp: Path
) -> None:
    """What CRIU reads is what was hashed: the copy's bytes, compared with the manifest as they are written."""
    cap = capture(worker.pid, tmp_path / "art", criu=criu)
    images_seen: list[dict[str, str]] = []

    def look(artifact: Path, manifest: Manifest) -> None:
        (copy,) = node_tmp.glob("podsnap-images-*")
        assert stat.S_IMODE(copy.stat().st_mode) == 0o700
        here = {p.name: _digest.new(manifest.digest) for p in copy.iterdir()}
        for name, h in here.items():
            h.update((copy / name).read_bytes())
        images_seen.append({name: h.hexdigest() for name, h in here.items()})
        for p in (artifact / "criu").iterdir():
            _forge(p)

    restore(tmp_path / "art", RestoreOptions(before_restore=look), criu=criu)
    listed = {Path(f.path).name: f.digest for f in cap.manifest.files if f.path.startswith("criu/")}
    assert images_seen == [listed], "the copy holds exactly the listed images, each with its manifest digest"
    assert worker.get()["init_id"] == worker.init_id


@pytest.fixture
def conf_writer(tmp_path: Path) -> Iterator[tuple[Path, list[Path]]]:
    """A hostile writer of the log dir: every CRIU config file that appears under it is replaced at once
    with one that breaks the run (what the agent's log dir on the shared volume allowed)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    planted = logs / "podsnap-restore-planted"
    planted.mkdir()
    for d in (logs, planted):
        (d / "restore.conf").write_text("no-such-option-planted\n")
    found: list[Path] = []
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(0.001):
            for conf in logs.rglob("*.conf"):
                if conf.read_text() != "no-such-option-planted\n":
                    found.append(conf)
                    with contextlib.suppress(OSError):
                        conf.write_text("no-such-option-planted\n")

    t = threading.Thread(target=run, daemon=True)
    t.start()
    yield logs, found
    stop.set()
    t.join()


def test_criu_work_dir_is_private_and_a_config_planted_in_the_log_dir_changes_nothing(
    criu: Criu, worker: Worker, tmp_path: Path, node_tmp: Path, conf_writer: tuple[Path, list[Path]]
) -> None:
    logs, found = conf_writer
    cap = capture(worker.pid, tmp_path / "art", CaptureOptions(log_dir=logs), criu=criu)
    seen = CriuArgs(criu.binary.exe)
    restore(tmp_path / "art", RestoreOptions(expected_manifest_digest=cap.manifest_digest, log_dir=logs), criu=criu,
            progress=seen)  # fmt: skip
    assert worker.get()["init_id"] == worker.init_id
    work, config = seen.private("-W", node_tmp), seen.arg("--config")
    assert config.parent == work and config.name == "restore.conf"
    assert not work.is_relative_to(logs) and found == [], "no config of CRIU's was ever under the log dir"
    assert list(node_tmp.iterdir()) == [], "the private work dir is removed after a successful run"


def _failing_restore(tmp_path: Path, criu: Criu) -> Criu:
    """A CRIU that dumps for real and fails every restore after writing an error into its log."""
    script = tmp_path / "criu-restore-fails"
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = restore ]; then\n'
        '  while [ $# -gt 0 ]; do [ "$1" = -W ] && w="$2"; shift; done\n'
        '  echo "Error (criu/cr-restore.c:1): injected restore failure" > "$w/restore.log"; exit 1\n'
        "fi\n"
        f'exec {criu.binary.exe} "$@"\n'
    )
    script.chmod(0o755)
    return Criu(CriuBinary(script))


def test_a_failed_runs_log_is_copied_to_the_log_dir_and_named_in_the_error(
    criu: Criu, worker: Worker, tmp_path: Path, node_tmp: Path
) -> None:
    logs = tmp_path / "logs"
    capture(worker.pid, tmp_path / "art", criu=criu)
    with pytest.raises(RestoreError, match="injected restore failure") as err:
        restore(tmp_path / "art", RestoreOptions(log_dir=logs), criu=_failing_restore(tmp_path, criu))
    log = err.value.log_path
    assert log is not None and log.parent.parent == logs and log.parent.name.startswith("podsnap-restore-")
    assert f"(full log: {log})" in str(err.value), "the message names the copy"
    assert "injected restore failure" in log.read_text()
    assert list(node_tmp.iterdir()) == [], "the private work dir and the images' copy are gone"
    # without a log dir the private work dir itself is kept, and named
    with pytest.raises(RestoreError) as err:
        restore(tmp_path / "art", criu=_failing_restore(tmp_path, criu))
    kept = err.value.log_path
    assert kept is not None and kept.parent.parent == node_tmp and str(kept) in str(err.value)
    assert [p.name for p in node_tmp.iterdir()] == [kept.parent.name], "only the work dir, not the images' copy"


def test_a_log_dir_that_is_a_symlink_gets_no_copy_and_the_private_log_is_named(
    criu: Criu, worker: Worker, tmp_path: Path, node_tmp: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    logs = tmp_path / "logs"
    logs.symlink_to(elsewhere)
    capture(worker.pid, tmp_path / "art", criu=criu)
    with pytest.raises(RestoreError) as err:
        restore(tmp_path / "art", RestoreOptions(log_dir=logs), criu=_failing_restore(tmp_path, criu))
    assert list(elsewhere.iterdir()) == [], "nothing written through the planted symlink"
    kept = err.value.log_path
    assert kept is not None and kept.is_relative_to(node_tmp) and kept.is_file()


@pytest.mark.parametrize("image", ["core-*.img", "pagemap-*.img"], ids=["written-by-criu", "rewritten-by-the-cut"])
def test_an_image_changed_on_the_volume_after_the_dump_is_not_vouched_for(
    criu: Criu, tmp_path: Path, image: str
) -> None:
    """Capture: CRIU's small images are hashed from the agent's own fds right after the dump, the ones the cut
    writes anew right after the cut; a change on the volume after that (here: while the capture adds its
    files, before its hash phase) is never recorded as the artifact's content."""
    worker = Worker(tmp_path / "w", bulk_mib=16)  # a region the cut moves out: its pagemap is rewritten
    original: dict[str, bytes] = {}

    def tamper(staging: Path) -> dict[str, str]:
        for path in sorted((staging / "criu").glob(image))[:1]:
            original[path.name] = path.read_bytes()
            _forge(path)
        return {}

    try:
        cap = capture(worker.pid, tmp_path / "art", CaptureOptions(before_publish=tamper), criu=criu)
        assert cap.manifest.bulk, "the cut ran"
        (name, data) = next(iter(original.items()))
        entry = next(f for f in cap.manifest.files if f.path == f"criu/{name}")
        h = _digest.new(cap.manifest.digest)
        h.update(data)
        assert entry.digest == h.hexdigest(), "the manifest holds the digest of what CRIU (or the cut) wrote"
        with pytest.raises(ArtifactError, match=rf"{name}: .* differs from the manifest's"):
            restore(tmp_path / "art", RestoreOptions(expected_manifest_digest=cap.manifest_digest), criu=criu)
        assert read_manifest(tmp_path / "art").files == cap.manifest.files
    finally:
        worker.kill()


def test_an_image_that_grows_on_the_volume_after_the_dump_fails_the_capture(
    criu: Criu, worker: Worker, tmp_path: Path
) -> None:
    def grow(staging: Path) -> dict[str, str]:
        (inventory,) = (staging / "criu").glob("inventory.img")
        with inventory.open("ab") as f:
            f.write(b"forged")
        return {}

    with pytest.raises(CaptureError, match=r"inventory\.img: has [0-9]+ bytes, not the [0-9]+ it had when hashed"):
        capture(worker.pid, tmp_path / "art", CaptureOptions(before_publish=grow, leave_running=True), criu=criu)
    assert not (tmp_path / "art").exists()
    assert worker.get()["init_id"] == worker.init_id
