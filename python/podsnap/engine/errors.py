"""Typed errors of the engine, grouped by how a caller reacts.

::

    EngineError                 anything the engine refuses or fails to do
    ├── CriuError               CRIU exited non-zero or is unusable; names its kept log (`log_path`)
    ├── CudaError               a CUDA driver checkpoint call returned an error (call, pid, error name)
    ├── ArtifactError           an artifact is missing, malformed, tampered or truncated (names the file)
    ├── CompatibilityError      a restore gate refused this host (gate, expected, found); not retryable here
    ├── CaptureError            the capture workflow failed; the source was kept serving when it could be
    └── RestoreError            the restore workflow failed; nothing it restored was left running

The node agent maps CompatibilityError to the pod reason `RestoreIncompatible` and every other
EngineError to `RestoreFailed` / `CaptureFailed`. CaptureError and RestoreError chain the lower-level
cause (`__cause__`), so the message says what happened and the cause says why.
"""

from __future__ import annotations

from pathlib import Path


class EngineError(Exception):
    """Base of every error the engine raises on purpose."""


class CriuError(EngineError):
    """CRIU failed or is unusable. The message is one sentence: what failed, CRIU's first error line, and
    where the full log is. `log_path` is that log (kept on disk), `log_tail` its last lines (errors
    first) for a caller that wants them in its own log, `returncode` CRIU's exit status."""

    def __init__(
        self,
        message: str,
        *,
        log_tail: str = "",
        log_path: Path | None = None,
        returncode: int | None = None,
    ) -> None:
        self.log_tail = log_tail
        self.log_path = log_path
        self.returncode = returncode
        super().__init__(message)


class CudaError(EngineError):
    """A CUDA driver call failed: `call` (e.g. cuCheckpointProcessLock), `pid`, `error` (e.g. CUDA_ERROR_NOT_READY)."""

    def __init__(self, call: str, pid: int | None, error: str, detail: str = "") -> None:
        self.call = call
        self.pid = pid
        self.error = error
        where = f" for pid {pid}" if pid is not None else ""
        extra = f": {detail}" if detail else ""
        super().__init__(f"{call}{where} failed with {error}{extra}")


class ArtifactError(EngineError):
    """The artifact cannot be used. `path` names the offending file (or the artifact directory).

    `unsupported`: written in a format this podsnap cannot read (a newer schema, digest algorithm or chunk
    size): the artifact may be fine for a newer podsnap, so a caller must not treat it as broken."""

    def __init__(self, message: str, *, path: str | None = None, unsupported: bool = False) -> None:
        self.path = path
        self.unsupported = unsupported
        super().__init__(message)


class CompatibilityError(EngineError):
    """A pre-restore gate refused this host. Override only with an explicit skip (`skip_compat=True`)."""

    def __init__(self, gate: str, expected: object, found: object, hint: str = "") -> None:
        self.gate = gate
        self.expected = expected
        self.found = found
        fix = hint or "restore on a matching host, or pass skip_compat=True / --skip-compat-check to override"
        super().__init__(f"incompatible host: gate {gate!r} expected {expected!r}, found {found!r} ({fix})")


class CaptureError(EngineError):
    """The capture workflow failed. `source_alive` says whether the source process still runs;
    `log_path` names CRIU's kept log when CRIU was the cause; `no_space`: a write found the artifact's
    filesystem full (ENOSPC or EDQUOT, podsnap's own or CRIU's)."""

    def __init__(
        self,
        message: str,
        *,
        phase: str,
        source_alive: bool | None = None,
        log_path: Path | None = None,
        no_space: bool = False,
    ) -> None:
        self.phase = phase
        self.source_alive = source_alive
        self.log_path = log_path
        self.no_space = no_space
        super().__init__(f"capture failed during {phase}: {message}")


class RestoreError(EngineError):
    """The restore workflow failed; whatever it had restored was killed. `log_path`: CRIU's kept log, if any."""

    def __init__(self, message: str, *, phase: str, log_path: Path | None = None) -> None:
        self.phase = phase
        self.log_path = log_path
        super().__init__(f"restore failed during {phase}: {message}")
