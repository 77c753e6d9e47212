"""`podsnap.controldir`: the one control-dir implementation, and the symlink attacks on the agent's writes.

The attacks are real: a directory tree stands for a container's root (what the agent reaches through
/proc/PID/root), with symlinks planted by "the workload" that point at a "host" file outside it.
"""

from __future__ import annotations

import errno
import json
import os
import threading
from pathlib import Path

import pytest

from podsnap import contract as c
from podsnap import controldir
from podsnap.agent import control
from podsnap.controldir import (
    ControlDir,
    ControlDirMissing,
    ControlDirTimeout,
    InvalidRestoreContext,
    UnsafeControlDir,
)

pytestmark = pytest.mark.skipif(not controldir.openat2_available(), reason="openat2 unavailable (Linux >= 5.6)")

HOST_SECRET = b"host file: must never change\n"


@pytest.fixture
def host_file(tmp_path: Path) -> Path:
    host = tmp_path / "host" / "etc-shadow"
    host.parent.mkdir()
    host.write_bytes(HOST_SECRET)
    return host


def fake_root(tmp_path: Path) -> Path:
    root = tmp_path / "proc" / "77" / "root"
    root.mkdir(parents=True)
    return root


def test_worker_side_round_trip_of_the_protocol(tmp_path: Path) -> None:
    ctl = ControlDir(tmp_path)
    ctl.write_ready({"pid": 12})
    assert json.loads((tmp_path / c.FILE_READY_FOR_SNAPSHOT).read_text()) == {"pid": 12}
    assert ctl.read_context() == c.RestoreContext()  # absent: empty
    ctl.signal_restored({"POD_IP": "10.0.0.7"})
    assert ctl.read_context().env == {"POD_IP": "10.0.0.7"}
    assert ctl.exists(c.FILE_RESTORE_COMPLETE)
    # no temporary file is left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [c.FILE_READY_FOR_SNAPSHOT, c.FILE_RESTORE_CONTEXT, c.FILE_RESTORE_COMPLETE]
    )
    ctl.clear_stale()
    assert list(tmp_path.iterdir()) == []


def test_a_malformed_context_names_the_file(tmp_path: Path) -> None:
    (tmp_path / c.FILE_RESTORE_CONTEXT).write_text('{"env": {"A": 1}}')
    with pytest.raises(InvalidRestoreContext, match=f"{c.FILE_RESTORE_CONTEXT}.*'env'"):
        ControlDir(tmp_path).read_context()
    (tmp_path / c.FILE_RESTORE_CONTEXT).write_text("{nope")
    with pytest.raises(InvalidRestoreContext, match="not valid JSON"):
        ControlDir(tmp_path).read_context()


def test_wait_for_returns_when_the_file_appears_and_times_out_otherwise(tmp_path: Path) -> None:
    ctl = ControlDir(tmp_path)
    with pytest.raises(ControlDirTimeout, match=f"{c.FILE_READY_FOR_SNAPSHOT} did not appear within 0.2 s"):
        ctl.wait_for(c.FILE_READY_FOR_SNAPSHOT, timeout_s=0.2, poll_s=0.01)
    polls: list[float] = []

    def writer(waited: float) -> None:
        polls.append(waited)
        if len(polls) == 3:
            ctl.write_ready({})

    waited = ctl.wait_for(c.FILE_READY_FOR_SNAPSHOT, timeout_s=30, poll_s=0.01, on_poll=writer)
    assert len(polls) == 3 and 0 < waited < 30


def test_on_poll_can_end_the_wait(tmp_path: Path) -> None:
    def died(_: float) -> None:
        raise RuntimeError("worker exited")

    with pytest.raises(RuntimeError, match="worker exited"):
        ControlDir(tmp_path).wait_for("x", timeout_s=None, poll_s=0.01, on_poll=died)


def test_a_missing_dir_is_reported_as_the_volume(tmp_path: Path) -> None:
    with pytest.raises(ControlDirMissing, match="snapshot control volume mounted"):
        ControlDir(tmp_path / "nope").write_ready({})
    with pytest.raises(FileNotFoundError, match="snapshot control volume mounted"):
        control.signal_restored(control.control_dir(9, "/snapshot-control", tmp_path), {})


def test_concurrent_writers_never_show_a_partial_file(tmp_path: Path) -> None:
    ctl = ControlDir(tmp_path)
    big = {f"K{i}": "v" * 100 for i in range(2000)}
    stop = threading.Event()
    bad: list[str] = []

    def read() -> None:
        while not stop.is_set():
            try:
                ctl.read_context()
            except InvalidRestoreContext as e:
                bad.append(str(e))

    t = threading.Thread(target=read)
    t.start()
    try:
        for _ in range(30):
            ctl.signal_restored(big)
    finally:
        stop.set()
        t.join()
    assert bad == []


# --- the agent's writes into an untrusted container root ---------------------------------------


def test_agent_writes_land_inside_the_container_root(tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    (root / "snapshot-control").mkdir()
    control.signal_restored(control.control_dir(77, "/snapshot-control", tmp_path / "proc"), {"POD_NAME": "new"})
    assert c.RestoreContext.from_json((root / "snapshot-control" / c.FILE_RESTORE_CONTEXT).read_text()).env == {
        "POD_NAME": "new"
    }
    assert (root / "snapshot-control" / c.FILE_RESTORE_COMPLETE).read_bytes() == b"1\n"


def test_a_symlink_planted_at_a_file_name_is_replaced_not_followed(tmp_path: Path, host_file: Path) -> None:
    root = fake_root(tmp_path)
    ctl_dir = root / "snapshot-control"
    ctl_dir.mkdir()
    (ctl_dir / c.FILE_RESTORE_CONTEXT).symlink_to(host_file)
    (ctl_dir / c.FILE_RESTORE_COMPLETE).symlink_to(os.path.relpath(host_file, ctl_dir))
    control.signal_restored(control.control_dir(77, "/snapshot-control", tmp_path / "proc"), {"POD_NAME": "x"})
    assert host_file.read_bytes() == HOST_SECRET
    for name in (c.FILE_RESTORE_CONTEXT, c.FILE_RESTORE_COMPLETE):
        assert not (ctl_dir / name).is_symlink(), name
    assert (ctl_dir / c.FILE_RESTORE_COMPLETE).read_bytes() == b"1\n"


def test_a_hard_link_planted_at_a_file_name_is_replaced_not_written_through(tmp_path: Path, host_file: Path) -> None:
    root = fake_root(tmp_path)
    ctl_dir = root / "snapshot-control"
    ctl_dir.mkdir()
    os.link(host_file, ctl_dir / c.FILE_RESTORE_COMPLETE)
    control.signal_restored(control.control_dir(77, "/snapshot-control", tmp_path / "proc"), {})
    assert host_file.read_bytes() == HOST_SECRET


@pytest.mark.parametrize("absolute", [True, False])
def test_a_symlinked_control_dir_is_refused(tmp_path: Path, host_file: Path, absolute: bool) -> None:
    root = fake_root(tmp_path)
    target = host_file.parent
    (root / "snapshot-control").symlink_to(target if absolute else os.path.relpath(target, root))
    before = sorted(p.name for p in target.iterdir())
    with pytest.raises(UnsafeControlDir, match="symlink"):
        control.signal_restored(control.control_dir(77, "/snapshot-control", tmp_path / "proc"), {"A": "1"})
    assert sorted(p.name for p in target.iterdir()) == before
    assert host_file.read_bytes() == HOST_SECRET


def test_a_symlink_higher_up_the_container_path_is_refused(tmp_path: Path, host_file: Path) -> None:
    root = fake_root(tmp_path)
    (root / "var").symlink_to(tmp_path / "host")
    (tmp_path / "host" / "snapshot-control").mkdir()
    with pytest.raises(UnsafeControlDir):
        control.signal_restored(control.control_dir(77, "/var/snapshot-control", tmp_path / "proc"), {})
    assert list((tmp_path / "host" / "snapshot-control").iterdir()) == []


def test_dotdot_cannot_climb_out_of_the_root(tmp_path: Path, host_file: Path) -> None:
    root = fake_root(tmp_path)
    (root / "host").mkdir()  # where RESOLVE_IN_ROOT puts "../../../host": inside the root
    ctl = ControlDir.in_root(root, "/../../../host")
    ctl.write_ready({})
    assert (root / "host" / c.FILE_READY_FOR_SNAPSHOT).exists()
    assert not (host_file.parent / c.FILE_READY_FOR_SNAPSHOT).exists()


def test_without_openat2_the_agent_refuses_naming_the_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = fake_root(tmp_path)
    (root / "snapshot-control").mkdir()

    def old_kernel(*_: object, **__: object) -> int:  # stand-in for a kernel before 5.6 / a seccomp filter
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(controldir, "openat2", old_kernel)
    with pytest.raises(UnsafeControlDir, match=r"openat2 is unavailable \(Linux >= 5.6"):
        control.signal_restored(control.control_dir(77, "/snapshot-control", tmp_path / "proc"), {})
    assert list((root / "snapshot-control").iterdir()) == []


def test_a_symlink_at_a_read_file_is_refused(tmp_path: Path, host_file: Path) -> None:
    (tmp_path / "ctl").mkdir()
    (tmp_path / "ctl" / c.FILE_RESTORE_CONTEXT).symlink_to(host_file)
    with pytest.raises(UnsafeControlDir, match="symlink"):
        ControlDir(tmp_path / "ctl").read_context()


def test_names_must_be_plain(tmp_path: Path) -> None:
    for bad in ("", "..", "a/b"):
        with pytest.raises(ValueError, match="plain file name"):
            ControlDir(tmp_path).write_file(bad, b"")
    with pytest.raises(ValueError, match="not the root"):
        ControlDir.in_root(tmp_path, "/")
