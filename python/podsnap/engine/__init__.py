"""podsnap's node engine: checkpoint a process tree (CUDA + CRIU) into an artifact, restore it elsewhere.

Kubernetes-free; the node agent and the `podsnap` CLI drive it. Import only from here.

Capture (host PIDs; CRIU >= 4 found via PODSNAP_CRIU, .tools/bin/criu, PATH)::

    from podsnap.engine import capture, CaptureOptions, CriuOptions
    result = capture(pid, "/artifacts/snap-1", CaptureOptions(
        namespace_pid=container_init_pid,     # run CRIU inside the pod's namespaces (None: on the host)
        criu=CriuOptions(tcp="close"),        # container defaults: shell-job, file-locks, ext-unix-sk, ...
        extra={"pod": {"name": ..., "uid": ...}},  # free-form manifest sections
    ), progress=print)
    result.artifact, result.manifest, result.timings_ms, result.bytes_total, result.cuda_pids
    result.manifest_digest                    # "sha256:...": record it, pass it back to restore

    Steps: cuInit(0); Lock(30 s) + Checkpoint every CUDA pid of the tree; CRIU dump into a staging dir
    next to `out`; cut: runs of >= 256 KiB of private anonymous memory (the CUDA checkpoint's host copy of
    GPU memory, heaps) leave CRIU's images for raw files under bulk/ (renamed, not copied; manifest
    schema 2 lists them as extents; `fast_restore=False` keeps the schema 1 layout), and the mappings
    they mostly fill get MADV_HUGEPAGE in CRIU's mm image (`bulk_hugepages=False`: not); manifest (host
    facts, tree, CUDA pids, per-file sha256, per-64-MiB-chunk sha256 of large files); fsync; rename to
    `out`. CRIU's dump ends the source (`leave_running=True` keeps it: CUDA is restored + unlocked after
    the dump). On any failure before that, CUDA is restored + unlocked so the source
    keeps serving, the staging dir is removed, and CaptureError(phase=..., source_alive=...) is raised.

Recovery after the capturing process died (`CaptureOptions.journal`: a record of the capture's steps,
written atomically and synced before each step touches the source, removed when the capture ends)::

    from podsnap.engine import read_capture_journal, recover_capture
    record = read_capture_journal(path)       # pid + start time + boot id, CUDA pids, the step reached
    recovery = recover_capture(record)        # CUDA state given back (Restore/Unlock as the driver's state
                                              # says), a tree CRIU left stopped continued; never touches a
                                              # reused pid; recovery.summary(), .actions, .problems

Restore::

    from podsnap.engine import restore, RestoreOptions
    result = restore("/artifacts/snap-1", RestoreOptions(
        namespace_pid=placeholder_init_pid,   # restore inside the placeholder's namespaces + cgroups
        skip_compat=False,                    # True only for podsnap.io/skip-compat-check: "true"
        gpu_map=None,                         # {old_uuid: new_uuid}; default: same UUIDs, else by index
        expected_manifest_digest=recorded,    # checked before the manifest is parsed
    ))
    result.pid, result.ns_pid, result.pids, result.timings_ms, result.phase_bytes, result.skipped_gates

    Steps: the manifest's digest (when given); every file regular (lstat) with its size, nothing unlisted
    among the images; sha256 of every file but the bulk ones (ArtifactError names the file); gates arch,
    kernel, driver, gpu-model, gpu-count, memory, memory-limit (when `memory_limit_bytes` is given)
    (CompatibilityError(gate, expected, found)); CRIU restore -d with a pidfile (schema 2:
    --leave-stopped, then `fill_workers` threads write the bulk extents into the stopped processes
    (process_vm_writev, else /proc/PID/mem), checking each chunk's sha256 as they read it, then
    SIGCONT); CUDA Restore + Unlock. Any failure kills what was restored (a bad chunk: ArtifactError
    naming it and its byte offset; else RestoreError). `verified_digests=True` (with
    `expected_manifest_digest`): the caller vouches for every file's digest (a node-local copy verified
    when cached), so types and sizes are checked and nothing is hashed.
    A schema 1 artifact restores through CRIU alone; a newer schema is refused ("upgrade podsnap").

Both take `progress=callable(Progress)` (phase, done, total bytes, finished) for long phases, and
`cuda=`/`criu=` to inject a CudaCheckpointer or a Criu (tests, other drivers).

Room for more than CRIU images: `CaptureOptions.before_publish(staging_dir) -> extra sections` adds
files (a rootfs diff, weight shards for a fast path) that are digested and verified like CRIU's, and
`RestoreOptions.before_restore(artifact, manifest)` runs after verification and gates, before CRIU
(e.g. apply the rootfs diff inside the placeholder).

Namespace mode (pods): CRIU runs inside namespace_pid's IPC, UTS, network, PID and mount namespaces,
entered through descriptors checked first (refused unless that process is in the host's user namespace,
those namespaces are the host's to control and its /proc is genuine; `namespace_start`, from
`process_start_time(pid)`, refuses a reused PID), and must be statically linked (refused otherwise: the
container's loader and libc would run it). It is exec'd through an O_PATH fd of its binary; the images
and the work dir reach it only as inherited O_PATH fds (`/proc/self/fd/N`), never mounted where the
workload could see them. `pid` stays a host PID; the captured root must not
be PID 1 of its PID namespace (refused at capture: that PID is never free in a destination). The
restore joins namespace_pid's cgroups; the tree comes back with the same namespace PIDs (which must be
free there: checked first) and is re-parented to that PID namespace's PID 1, so a placeholder that is
its container's PID 1 (e.g. `podsnap-run` standby without shareProcessNamespace) becomes the parent.
`RestoreResult.pid` is the host PID, `.ns_pid` the namespace PID.

Errors (see `podsnap.engine.errors`): EngineError > CriuError, CudaError, ArtifactError,
CompatibilityError, CaptureError, RestoreError. Messages are one or two sentences; when CRIU failed,
`error.log_path` names its full log (copied into `log_dir`; without one, CRIU's private work dir in
the system temp dir is kept) and
`CriuError.log_tail` carries the last lines for a caller's own log.

Also here: `read_manifest(dir)`, `verify(dir, manifest)` (every digest, bulk files too) and
`manifest_digest(dir)` for the agent's status and GC,
`check_compat(manifest, host_facts())` to report every failing gate, `remove_artifact(dir)`,
`gpu_facts()` for diagnostics, and the process helpers the CLI and demo need around a round trip:
`pid_exists(pid)`, `process_start_time(pid)`, `wait_gone(pid)`, `kill_tree(pids)`.

Layout: this facade re-exports from private modules (`_capture`, `_restore`, `_criu_*`, `_proctree`,
`_artifact`, `_manifest`, ...); code outside the engine imports only from here.
"""

from __future__ import annotations

from podsnap.engine._artifact import MANIFEST_MAX_BYTES, manifest_digest, read_manifest, verify
from podsnap.engine._artifact import remove as remove_artifact
from podsnap.engine._capture import capture
from podsnap.engine._compat import GateFailure
from podsnap.engine._compat import check as check_compat
from podsnap.engine._criu_binary import CriuBinary, find_binary
from podsnap.engine._criu_config import CriuOptions
from podsnap.engine._criu_runner import Criu
from podsnap.engine._cuda import CudaCheckpointer, DriverCuda, NoCuda, default_checkpointer
from podsnap.engine._host import HostFacts, host_facts
from podsnap.engine._journal import Recovery as CaptureRecovery
from podsnap.engine._journal import read as read_capture_journal
from podsnap.engine._journal import recover as recover_capture
from podsnap.engine._journal import start_time as process_start_time
from podsnap.engine._manifest import MANIFEST_NAME, SCHEMA_VERSION, FileEntry, Manifest
from podsnap.engine._nvml import GpuFacts, GpuInfo, gpu_facts
from podsnap.engine._options import (
    CaptureOptions,
    CaptureResult,
    Progress,
    ProgressFn,
    RestoreOptions,
    RestoreResult,
)
from podsnap.engine._proctree import ProcInfo, kill_tree, wait_gone
from podsnap.engine._proctree import exists as pid_exists
from podsnap.engine._restore import restore
from podsnap.engine.errors import (
    ArtifactError,
    CaptureError,
    CompatibilityError,
    CriuError,
    CudaError,
    EngineError,
    RestoreError,
)

__all__ = [
    "MANIFEST_MAX_BYTES",
    "MANIFEST_NAME",
    "SCHEMA_VERSION",
    "ArtifactError",
    "CaptureError",
    "CaptureOptions",
    "CaptureRecovery",
    "CaptureResult",
    "CompatibilityError",
    "Criu",
    "CriuBinary",
    "CriuError",
    "CriuOptions",
    "CudaCheckpointer",
    "CudaError",
    "DriverCuda",
    "EngineError",
    "FileEntry",
    "GateFailure",
    "GpuFacts",
    "GpuInfo",
    "HostFacts",
    "Manifest",
    "NoCuda",
    "ProcInfo",
    "Progress",
    "ProgressFn",
    "RestoreError",
    "RestoreOptions",
    "RestoreResult",
    "capture",
    "check_compat",
    "default_checkpointer",
    "find_binary",
    "gpu_facts",
    "host_facts",
    "kill_tree",
    "manifest_digest",
    "pid_exists",
    "process_start_time",
    "read_capture_journal",
    "read_manifest",
    "recover_capture",
    "remove_artifact",
    "restore",
    "verify",
    "wait_gone",
]
