"""Errors of the engine controller: each names the engine and the call that failed.

SnapshotError                       (podsnap.workload)
└── EngineError                     .engine ("vllm"), .call ("release_kv_cache_memory()"), .phase
    ├── EngineQuiesceError          also a QuiesceError: ready-for-snapshot was NOT written, and the
    │                               steps already done were undone (the undo stops at its first
    │                               failure, which is in .undo_errors)
    ├── EngineResumeError           also a ResumeError: the engine did not come back after the wait
    └── OutsideConnectionError      also a QuiesceError: the worker holds a connection that cannot
                                    follow it to another pod; nothing was quiesced
"""

from __future__ import annotations

from podsnap.workload import QuiesceError, ResumeError, SnapshotError


class EngineError(SnapshotError):
    """An engine call failed. `engine` and `call` say which; `__cause__` is the engine's own error."""

    def __init__(self, engine: str, call: str, phase: str, detail: str) -> None:
        RuntimeError.__init__(self, f"{engine}: {call} failed during {phase}: {detail}")
        self.engine = engine
        self.call = call
        self.phase = phase


class EngineQuiesceError(EngineError, QuiesceError):
    def __init__(self, engine: str, call: str, cause: BaseException, undo_errors: list[EngineError]) -> None:
        undone = "; undo also failed: " + "; ".join(str(e) for e in undo_errors) if undo_errors else ""
        EngineError.__init__(
            self,
            engine,
            call,
            "quiesce",
            f"{cause!r}; ready-for-snapshot was not written, the engine was resumed{undone}",
        )
        self.hook = f"{engine}.{call}"
        self.undo_errors = undo_errors


class EngineResumeError(EngineError, ResumeError):
    def __init__(self, engine: str, call: str, cause: BaseException) -> None:
        EngineError.__init__(self, engine, call, "resume", f"{cause!r}; the engine is not serving")
        self.hook = f"{engine}.{call}"


class OutsideConnectionError(EngineError, QuiesceError):
    def __init__(self, engine: str, connections: list[str]) -> None:
        EngineError.__init__(
            self,
            engine,
            "outside-connection check",
            "quiesce",
            f"established TCP connection(s) to {', '.join(connections)}: they cannot follow the process to a new pod. "
            "Run the snapshot controller before opening connections to outside services (discovery, NATS, etcd, "
            "telemetry), or pass EngineSnapshot(..., outside='warn')",
        )
        self.hook = f"{engine}.outside-connection-check"
        self.connections = connections
