"""Writing the workload contract files into a container's control directory from the host.

The agent reaches the directory through `/proc/<pid>/root`, the container's own root, so it needs no
volume of its own and writes exactly where the worker reads. The container is not trusted: the path is
resolved inside that root with no symlinks and every write is relative to the directory's descriptor
(`ControlDir.in_root`, openat2), so a symlink the workload planted cannot redirect the write to a host
file. `restore-complete` is written last and atomically: the worker (or the startup probe) acts as soon
as it appears.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from podsnap.controldir import ControlDir


def control_dir(pid: int, container_path: str, proc_root: Path = Path("/proc")) -> ControlDir:
    """The control dir `container_path` of the container process `pid`, reached safely through its root."""
    return ControlDir.in_root(proc_root / str(pid) / "root", container_path)


def signal_restored(directory: ControlDir, env: Mapping[str, str]) -> None:
    """`restore-context.json` then `restore-complete`; ControlDirMissing (a FileNotFoundError) names the volume."""
    directory.signal_restored(env)
