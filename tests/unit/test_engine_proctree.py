"""Process-tree helpers read from a fake /proc."""

from __future__ import annotations

from pathlib import Path


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
