"""Process-tree helpers read from a fake /proc."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_io_uring_users_are_found_from_their_fd_links(tmp_path: Path) -> None:
    from podsnap.engine._proctree import io_uring_users

    for pid, target in ((10, "anon_inode:[io_uring]"), (11, "socket:[123]"), (12, "/dev/null")):
        fd = tmp_path / str(pid) / "fd"
        fd.mkdir(parents=True)
        (fd / "3").symlink_to(target)
    assert io_uring_users([10, 11, 12, 13], proc=tmp_path) == [10]


def test_tree_of_this_process_starts_with_it() -> None:
    import os

    from podsnap.engine._proctree import exists, proc_info, tree

    me = os.getpid()
    assert tree(me)[0].pid == me
    assert proc_info(me).ppid == os.getppid()
    assert exists(me) and not exists(2**22 + 1)


def _cgroupfs(root: Path, *dirs: str) -> None:
    for d in dirs:
        (root / d.lstrip("/")).mkdir(parents=True, exist_ok=True)
        (root / d.lstrip("/") / "cgroup.procs").write_text("")


def test_a_cgroup_v2_host_joins_the_one_unified_cgroup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """cgroup v2 (the CI machine is v1, so the v2 layout is built here): /proc/PID/cgroup has the single line
    `0::PATH` and the whole hierarchy is mounted at the cgroup root itself."""
    from podsnap.engine import _proctree

    pod = "/kubepods.slice/kubepods-pod1234.slice/cri-containerd-abcd.scope"
    _cgroupfs(tmp_path, pod)
    monkeypatch.setattr(_proctree, "cgroups_as_host_sees", lambda pid: f"0::{pod}\n")
    assert _proctree.cgroup_procs_files(42, cgroup_root=tmp_path) == [f"{tmp_path}{pod}/cgroup.procs"]


def test_a_hybrid_host_joins_every_v1_hierarchy_and_the_unified_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from podsnap.engine import _proctree

    pod = "/kubepods/burstable/pod1234/abcd"
    _cgroupfs(tmp_path, f"cpu,cpuacct{pod}", f"memory{pod}", f"systemd{pod}", f"unified{pod}")
    (tmp_path / "cpu").symlink_to(tmp_path / "cpu,cpuacct")
    lines = f"12:memory:{pod}\n4:cpu,cpuacct:{pod}\n1:name=systemd:{pod}\n0::{pod}\n"
    monkeypatch.setattr(_proctree, "cgroups_as_host_sees", lambda pid: lines)
    assert _proctree.cgroup_procs_files(42, cgroup_root=tmp_path) == [
        f"{tmp_path}/memory{pod}/cgroup.procs",
        f"{tmp_path}/cpu,cpuacct{pod}/cgroup.procs",
        f"{tmp_path}/systemd{pod}/cgroup.procs",
        f"{tmp_path}/unified{pod}/cgroup.procs",
    ]


def test_a_v2_cgroup_missing_from_the_root_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from podsnap.engine import _proctree

    (tmp_path / "cgroup.procs").write_text("")  # a container's own view: only its root
    monkeypatch.setattr(_proctree, "cgroups_as_host_sees", lambda pid: "0::/kubepods.slice/pod9.scope\n")
    with pytest.raises(FileNotFoundError, match=r"cgroup v2:/kubepods.slice/pod9.scope of pid 42"):
        _proctree.cgroup_procs_files(42, cgroup_root=tmp_path)
