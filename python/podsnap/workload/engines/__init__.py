"""Snapshot support for real inference engines: one controller, one small adapter per engine.

    from podsnap.workload.engines import EngineSnapshot
    from podsnap.workload.engines.vllm import VllmAdapter

    llm = LLM(model, enable_sleep_mode=True)        # built, compiled and warmed up
    EngineSnapshot(VllmAdapter(llm)).run()         # BEFORE any connection to outside services
    serve(llm)

Adapters: `vllm.VllmAdapter`, `sglang.SglangAdapter`, `trtllm.TrtllmAdapter` (each on the engine's
Python object, or `.http(base_url)` on its admin endpoints). `safe_env(engine)` (module `checkpoint_env`, standard library only) is the
checkpoint-safe environment the pod webhook applies. docs/engines.md has the feature matrix.
"""

from podsnap.workload.engines._adapter import Call, Checked, EngineAdapter, HttpAdmin, Step
from podsnap.workload.engines._connections import outside_connections
from podsnap.workload.engines._controller import (
    EXIT_RESTORE_TIMEOUT,
    EXIT_SNAPSHOT_COMPLETE,
    EngineOutcome,
    EngineSnapshot,
)
from podsnap.workload.engines._errors import (
    EngineError,
    EngineQuiesceError,
    EngineResumeError,
    OutsideConnectionError,
)
from podsnap.workload.engines.checkpoint_env import safe_env

__all__ = [
    "EXIT_RESTORE_TIMEOUT",
    "EXIT_SNAPSHOT_COMPLETE",
    "Call",
    "Checked",
    "EngineAdapter",
    "EngineError",
    "EngineOutcome",
    "EngineQuiesceError",
    "EngineResumeError",
    "EngineSnapshot",
    "HttpAdmin",
    "OutsideConnectionError",
    "Step",
    "outside_connections",
    "safe_env",
]
