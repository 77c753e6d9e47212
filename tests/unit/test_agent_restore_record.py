"""The agent's own record of the restores it began (agent/restore_record.py): what a starting agent reads to
decide that a restore was interrupted, instead of the pod's user-writable status."""

from __future__ import annotations

from pathlib import Path

import pytest

from podsnap.agent import restore_record

UID = "3f2c8a9e-1b4d-4e6f-9a7b-0c1d2e3f4a5b"
CID = "ab" * 32


def test_a_begun_restore_is_found_until_it_ends(tmp_path: Path) -> None:
    assert restore_record.interrupted(tmp_path, UID) is None, "no record: no restore this agent began"
    restore_record.begin(tmp_path, UID, CID)
    assert restore_record.interrupted(tmp_path, UID) == CID
    assert sorted(p.name for p in tmp_path.iterdir()) == [UID], "no temporary file is left"
    restore_record.end(tmp_path, UID)
    assert restore_record.interrupted(tmp_path, UID) is None
    restore_record.end(tmp_path, UID)  # twice: the pod's deletion after the verdict


def test_what_is_not_a_record_of_this_agent_counts_for_nothing(tmp_path: Path) -> None:
    (tmp_path / UID).symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").write_text(f"{CID}\n")
    assert restore_record.interrupted(tmp_path, UID) is None, "a symlink is not followed"
    (tmp_path / UID).unlink()
    (tmp_path / UID).write_text("containerd-0\n")
    assert restore_record.interrupted(tmp_path, UID) is None, "only a whole container ID is a record"
    assert restore_record.interrupted(tmp_path, "../" + UID) is None


def test_only_whole_ids_and_uids_are_recorded(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="64 hex"):
        restore_record.begin(tmp_path, UID, "containerd://" + CID)
    with pytest.raises(ValueError, match="pod uid"):
        restore_record.begin(tmp_path, "../x", CID)
    assert not list(tmp_path.iterdir())
