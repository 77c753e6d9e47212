"""Empty namespace directories of the artifact volume are removed, never one in use or just made."""

from __future__ import annotations

import os
import time
from pathlib import Path

from podsnap.agent.volume_sweep import remove_empty_namespace_dirs


def aged(path: Path, seconds: float) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    then = time.time() - seconds
    os.utime(path, (then, then))
    return path


def test_only_old_empty_namespace_dirs_go(tmp_path: Path) -> None:
    old_empty = aged(tmp_path / "ns-old", 3600)
    fresh_empty = aged(tmp_path / "ns-fresh", 5)
    old_full = tmp_path / "ns-used"
    (old_full / "snap-uid").mkdir(parents=True)
    aged(old_full, 3600)
    own = aged(tmp_path / ".journal", 3600)
    (tmp_path / "file").write_text("x")

    assert remove_empty_namespace_dirs(tmp_path, grace_s=600) == ["ns-old"]
    assert not old_empty.exists()
    assert fresh_empty.is_dir() and old_full.is_dir() and own.is_dir()
    assert remove_empty_namespace_dirs(tmp_path / "missing") == []
