"""Writing the workload contract files into a container's control directory from the host.

The agent reaches the directory through `/proc/<pid>/root`, the container's own root, so it needs no
volume of its own and writes exactly where the worker reads. `restore-complete` is written last and
atomically: the worker (or the startup probe) acts as soon as it appears.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from podsnap import contract as c


def control_dir(pid: int, container_path: str, proc_root: Path = Path("/proc")) -> Path:
    return proc_root / str(pid) / "root" / container_path.lstrip("/")


def _write_atomic(path: Path, data: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(data)
    tmp.replace(path)


def signal_restored(directory: Path, env: Mapping[str, str]) -> None:
    if not directory.is_dir():
        raise FileNotFoundError(
            f"control directory {directory} is missing: is the {c.CONTROL_VOLUME_NAME} volume mounted?"
        )
    _write_atomic(directory / c.FILE_RESTORE_CONTEXT, c.RestoreContext(env=dict(env)).to_json())
    _write_atomic(directory / c.FILE_RESTORE_COMPLETE, "1\n")
