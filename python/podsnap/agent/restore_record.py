"""The agent's own record of the restores it began on this node: what decides that a restore was
interrupted, and into which container.

The pod's condition `podsnap.io/Restored` says `RestoreInProgress` while a restore runs, but a pod's
status can be written by its namespace's users, so a starting agent does not take it as proof that an
earlier agent of this node left a restore half done: only a record here, in the node-local state
directory that nobody but this node's agent writes (agent/state_dir.py), is. A record is one file per pod
UID holding the 64-hex ID of the container restored into; it is written before CRIU runs and removed
once the restore's verdict is on the pod.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

#: the records' directory below the agent's state directory
RESTORING = "restoring"

_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_ID = re.compile(r"[0-9a-f]{64}")


def _path(directory: Path, pod_uid: str) -> Path:
    if not _UID.fullmatch(pod_uid):
        raise ValueError(f"pod uid {pod_uid[:60]!r} is not a UID the API server assigns")
    return directory / pod_uid


def begin(directory: Path, pod_uid: str, container_id: str) -> None:
    """Record that a restore into container `container_id` (64 hex) of pod `pod_uid` begins; durable before
    it returns (the agent may be killed the next moment, and its successor must find it)."""
    if not _ID.fullmatch(container_id):
        raise ValueError(f"container id {container_id[:80]!r} is not 64 hex digits")
    target = _path(directory, pod_uid)
    tmp = directory / f".{pod_uid}.tmp"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, f"{container_id}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    tmp.replace(target)
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def end(directory: Path, pod_uid: str) -> None:
    """The restore of pod `pod_uid` has its verdict (or the pod is gone): nothing of it is left to clean up."""
    with contextlib.suppress(FileNotFoundError, ValueError):
        _path(directory, pod_uid).unlink()


def interrupted(directory: Path, pod_uid: str) -> str | None:
    """The container ID (64 hex) a restore into pod `pod_uid` began with and never finished, or None when
    this node's agent began none (whatever the pod's status says)."""
    try:
        fd = os.open(_path(directory, pod_uid), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (FileNotFoundError, ValueError):
        return None
    except OSError:  # a symlink (ELOOP) or worse: not a record this agent wrote
        return None
    try:
        text = os.read(fd, 200).decode(errors="replace").strip()
    finally:
        os.close(fd)
    return text if _ID.fullmatch(text) else None
