"""In-process STAND-INS for engine objects (no engine can run on a CPU test machine).

Each stand-in has the methods the real engine object has for the adapter's calls (the contract
tests hold the adapters to the real signatures) and records every call, in order, into a shared
`Journal`, where the test's agent also writes what it sees. `fail` makes a named method raise.
"""

from __future__ import annotations

import threading
from typing import Any


class EngineFault(RuntimeError):
    """What a stand-in raises when told to fail: the engine's own error."""


class Journal:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.events: list[str] = []

    def add(self, event: str) -> None:
        with self._lock:
            self.events.append(event)


class _StandIn:
    def __init__(self, journal: Journal | None = None, fail: dict[str, Exception] | None = None) -> None:
        self.journal = journal or Journal()
        self.fail = fail or {}

    def _record(self, name: str, *args: Any, **kwargs: Any) -> None:
        shown = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
        self.journal.add(f"{name}({', '.join(shown)})")
        if name in self.fail:
            raise self.fail[name]


class VllmEngineStandIn(_StandIn):
    """Stands in for vLLM's synchronous `LLMEngine`."""

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        self._record("sleep", level=level, mode=mode)

    def wake_up(self, tags: list[str] | None = None) -> bool:
        self._record("wake_up", tags=tags)
        return True

    def release_kv_cache_memory(self) -> None:
        self._record("release_kv_cache_memory")

    def collective_rpc(
        self,
        method: str,
        timeout: float | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        self._record(f"collective_rpc:{method}", *args)
        return [None]


class VllmAsyncStandIn(_StandIn):
    """Stands in for vLLM's `AsyncLLM` (every call is a coroutine)."""

    async def pause_generation(self, *, mode: str = "abort", clear_cache: bool = True) -> None:
        self._record("pause_generation", mode=mode, clear_cache=clear_cache)

    async def resume_generation(self) -> None:
        self._record("resume_generation")

    async def release_kv_cache_memory(self) -> None:
        self._record("release_kv_cache_memory")

    async def sleep(self, level: int = 1, mode: str = "abort") -> None:
        self._record("sleep", level=level, mode=mode)

    async def wake_up(self, tags: list[str] | None = None) -> bool:
        self._record("wake_up", tags=tags)
        return True

    async def collective_rpc(
        self,
        method: str,
        timeout: float | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        self._record(f"collective_rpc:{method}", *args)
        return [None]


class _ServerArgs:
    model_path = "/models/stand-in"


class SglangEngineStandIn(_StandIn):
    """Stands in for `sglang.Engine`. `load_fails` makes `update_weights_from_disk` answer
    `(False, message, 0)` as SGLang does when its loader fails (it does not raise)."""

    server_args = _ServerArgs()
    load_fails: str | None = None

    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        self._record("release_memory_occupation", tags=tags)

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        self._record("resume_memory_occupation", tags=tags)

    def update_weights_from_disk(self, model_path: str, load_format: str | None = None) -> tuple[bool, str, int]:
        self._record("update_weights_from_disk", model_path=model_path)
        if self.load_fails is not None:
            return False, self.load_fails, 0
        return True, "Succeeded to update model weights.", 0


class TrtllmLLMStandIn(_StandIn):
    """Stands in for `tensorrt_llm.LLM` (PyTorch backend)."""

    def _collective_rpc(
        self, method: str, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None, non_block: bool = False
    ) -> list[Any]:
        self._record(f"_collective_rpc:{method}", *args)
        return [None]
