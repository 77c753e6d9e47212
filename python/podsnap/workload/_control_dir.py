"""The control directory: where the worker and the node agent meet (files named in `podsnap.contract`)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from podsnap.contract import (
    ENV_CONTROL_DIR,
    ENV_CONTROL_DIR_DYNAMO,
    FILE_READY_FOR_SNAPSHOT,
    FILE_RESTORE_COMPLETE,
    FILE_RESTORE_CONTEXT,
    RestoreContext,
)
from podsnap.workload._errors import ControlDirError, RestoreContextError


def control_dir_from_env(environ: Mapping[str, str] | None = None) -> Path | None:
    """The control dir the environment names (podsnap's variable first, then Dynamo's), or None.

    None means "no snapshot machinery here": the worker simply cold-starts and serves.
    """
    env = os.environ if environ is None else environ
    for name in (ENV_CONTROL_DIR, ENV_CONTROL_DIR_DYNAMO):
        value = env.get(name, "").strip()
        if not value:
            continue
        path = Path(value)
        if not path.is_dir():
            raise ControlDirError(
                f"{name}={value}: not a directory; mount the snapshot control volume there or unset {name}"
            )
        return path
    return None


def write_atomically(path: Path, data: bytes) -> None:
    """Write `path` so a reader (a probe's `cat`, the agent) sees either nothing or all of it."""
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def ready_path(control_dir: Path) -> Path:
    return control_dir / FILE_READY_FOR_SNAPSHOT


def complete_path(control_dir: Path) -> Path:
    return control_dir / FILE_RESTORE_COMPLETE


def context_path(control_dir: Path) -> Path:
    return control_dir / FILE_RESTORE_CONTEXT


def clear_stale(control_dir: Path) -> None:
    """Remove what a previous life left behind, so an old `restore-complete` cannot end the wait at once."""
    for path in (complete_path(control_dir), context_path(control_dir), ready_path(control_dir)):
        path.unlink(missing_ok=True)


def write_ready(control_dir: Path, info: Mapping[str, object]) -> Path:
    path = ready_path(control_dir)
    write_atomically(path, (json.dumps(dict(info), sort_keys=True) + "\n").encode())
    return path


def read_context(control_dir: Path) -> RestoreContext:
    """The new pod's context; an absent file means an empty one (a restore on the same host needs none)."""
    path = context_path(control_dir)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return RestoreContext()
    try:
        return RestoreContext.from_json(text)
    except json.JSONDecodeError as e:
        raise RestoreContextError(f'{path}: not valid JSON ({e}); expected {{"version": 1, "env": {{...}}}}') from e
    except ValueError as e:
        raise RestoreContextError(f"{path}: {e}") from e
