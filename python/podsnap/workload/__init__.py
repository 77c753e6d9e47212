"""podsnap's workload SDK: what runs inside a worker that can be captured and restored.

    from podsnap.workload import SnapshotControl

    snap = SnapshotControl()               # reads SNAPSHOT_CONTROL_DIR / DYN_SNAPSHOT_CONTROL_DIR
    snap.on_quiesce(engine.stop_generation)
    snap.on_resume(lambda info: engine.reconnect(os.environ["POD_IP"]))
    info = snap.checkpoint_and_wait()      # no-op without a control dir
    serve()

Weights out of the checkpoint (see `podsnap.workload._weights` and docs/weights.md): adopt the
immutable GPU tensors at load time, before compile/graph capture; they are offloaded at quiesce
(saved to host memory, or nothing at all when they come from a file the restore node has) and
streamed back at resume at the same addresses, so CUDA graphs replay unchanged.

    weights = Weights()
    weights.adopt_module(model, sources={"embed.weight": FileSource("/models/m.bin", offset=0)})
    weights.attach(snap)                   # after the quiesce hooks that stop generation

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
    WeightsError,
    WeightSourceError,
)
from podsnap.workload._snapshot import QuiesceHook, ResumeHook, ResumeInfo, SnapshotControl
from podsnap.workload._weights import FileSource, Weights

__all__ = [
    "ControlDirError",
    "FileSource",
    "QuiesceError",
    "QuiesceHook",
    "RestoreContextError",
    "RestoreTimeout",
    "ResumeError",
    "ResumeHook",
    "ResumeInfo",
    "SnapshotControl",
    "SnapshotError",
    "WeightSourceError",
    "Weights",
    "WeightsError",
    "control_dir_from_env",
]
