"""podsnap's workload SDK: what runs inside a worker that can be captured and restored.

    from podsnap.workload import SnapshotControl

    snap = SnapshotControl()               # reads SNAPSHOT_CONTROL_DIR / DYN_SNAPSHOT_CONTROL_DIR
    snap.on_quiesce(engine.stop_generation)
    snap.on_resume(lambda info: engine.reconnect(os.environ["POD_IP"]))
    info = snap.checkpoint_and_wait()      # no-op without a control dir
    serve()

`podsnap-run -- CMD...` (module `podsnap.workload.run`) is the standby-aware entrypoint for the
worker's container.
"""

from podsnap.workload._control_dir import control_dir_from_env
from podsnap.workload._errors import (
    ControlDirError,
    QuiesceError,
    RestoreContextError,
    RestoreTimeout,
    ResumeError,
    SnapshotError,
)
from podsnap.workload._snapshot import QuiesceHook, ResumeHook, ResumeInfo, SnapshotControl

__all__ = [
    "ControlDirError",
    "QuiesceError",
    "QuiesceHook",
    "RestoreContextError",
    "RestoreTimeout",
    "ResumeError",
    "ResumeHook",
    "ResumeInfo",
    "SnapshotControl",
    "SnapshotError",
    "control_dir_from_env",
]
