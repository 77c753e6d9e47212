"""The agent's node-local state: what must outlive the agent's pod yet may come from nobody but this node's
agent, above all the capture journal (engine/_journal.py), whose records make this privileged agent act on
PIDs of its node (give back CUDA state, SIGCONT).

The chart mounts a hostPath of the node for it (values.yaml `agent.stateDir`) into the agent alone. The
artifact volume is no such place: every node's agent writes it, and so does whoever else can write the
claim (docs/security.md). Journal records an older agent kept there (`<artifactRoot>/.journal/<node>`) are
never recovered from: `drop_volume_journal` removes them unread and says so once.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path

#: the journal's directory below the state directory
JOURNAL = "journal"
#: where agents before the node-local state kept their journal records, below the artifact root
VOLUME_JOURNAL = ".journal"


class UnsafeStateDir(Exception):
    """A state directory the agent must not use; the message names the path and the fix."""


def _refuse(path: Path, why: str) -> UnsafeStateDir:
    return UnsafeStateDir(
        f"agent state {path} {why}: the capture journal needs directories of uid {os.geteuid()}, no symlinks, "
        f"that nobody else can write. Remove {path} on the node (the agent makes it again), or point "
        "agent.stateDir (PODSNAP_STATE_DIR) at a directory of the node that only the agent uses"
    )


def _check(path: Path, *, private: bool) -> None:
    try:
        st = path.lstat()
    except OSError as exc:
        raise _refuse(path, f"cannot be read ({exc.strerror})") from None
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(path, f"is a symlink (to {path.readlink()})")
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(path, "is not a directory")
    if st.st_uid != os.geteuid():
        raise _refuse(path, f"is owned by uid {st.st_uid}")
    if private and st.st_mode & 0o022:
        raise _refuse(path, f"can be written by others (mode {stat.S_IMODE(st.st_mode):04o})")


def _make(path: Path, *, parents: bool) -> None:
    try:
        path.mkdir(mode=0o700, parents=parents, exist_ok=True)
    except FileExistsError:
        pass  # a dangling symlink or a file: _check says which
    except OSError as exc:
        raise _refuse(path, f"cannot be made ({exc.strerror})") from None


def private_dir(path: Path) -> Path:
    """`path` (the journal: `<state dir>/journal`), made 0700 when missing, once it and its parent, the state
    directory, are directories of this process's uid reached through no symlink, and nobody else can write
    the state directory; UnsafeStateDir otherwise. Checked at every use, not once at start: a capture writes
    its record here, and recovery acts on what it reads."""
    # the state directory first: nothing is made through a link there
    _make(path.parent, parents=True)
    _check(path.parent, private=True)
    _make(path, parents=False)
    _check(path, private=False)
    # ours (checked above): nobody but this uid reads or writes the records, whatever the umask made it
    path.chmod(0o700)
    return path


def drop_volume_journal(artifact_root: Path, node: str) -> list[str]:
    """Remove this node's journal directory on the artifact volume (what agents before the node-local state
    kept) without reading a record of it: anyone who can write the volume could have planted them. Returns
    the names removed, for one warning; the `.journal` directory goes too once no node has one left."""
    volume_journal = artifact_root / VOLUME_JOURNAL
    try:
        top = volume_journal.lstat()
    except FileNotFoundError:
        return []
    if not stat.S_ISDIR(top.st_mode):
        # a link planted in its place would lead the removal below elsewhere: only the link goes
        volume_journal.unlink()
        return [VOLUME_JOURNAL]
    path = volume_journal / node
    try:
        st = path.lstat()
    except FileNotFoundError:
        return []
    if stat.S_ISDIR(st.st_mode):
        names = sorted(p.name for p in path.iterdir())
        shutil.rmtree(path)  # does not follow symlinks inside
    else:
        names = [path.name]
        path.unlink()  # a symlink or a file planted in its place: the link itself, never its target
    # other nodes' agents may not have removed theirs yet
    with contextlib.suppress(OSError):
        volume_journal.rmdir()
    return names
