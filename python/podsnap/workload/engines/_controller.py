"""`EngineSnapshot`: capture an engine the worker has built, and bring it back in the new pod.

    engine = build_engine()                    # load weights, compile, warm up
    outcome = EngineSnapshot(VllmAdapter(engine)).run()   # before any outside connection
    connect_to_discovery(os.environ["POD_IP"])             # the NEW pod's identity
    serve(engine)

Sequence of `run()` (and of `await arun()` for engines whose calls are coroutines):
  1. refuse if the process tree holds a TCP connection to an outside address (it cannot follow
     the process to another pod): the controller must run before discovery, NATS, etcd and the like;
  2. quiesce through the adapter, step by step; a failing step undoes the steps before it (the
     undo stops at its first failure) and raises EngineQuiesceError (ready-for-snapshot is not written);
  3. `SnapshotControl.checkpoint_and_wait()`: the capture happens inside it;
  4. restored: resume through the adapter (undo steps, reverse order), apply the restore context
     (the SDK already put the new pod's env into os.environ; `on_restore` sees it too), mark resumed
     and return;
  5. snapshot complete in the source (the wait ended in the same process: the agent left the
     source running and released it) or no restore within `timeout_s`: exit the process at once
     with a one-line message, without tearing the engine down (status 0, or 124 on a timeout).
Without a control dir every step is skipped and `run()` returns at once: a plain cold start.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, NoReturn

from podsnap.workload import RestoreTimeout, ResumeInfo, SnapshotControl
from podsnap.workload.engines._adapter import Call, EngineAdapter, Step
from podsnap.workload.engines._connections import outside_connections
from podsnap.workload.engines._errors import (
    EngineError,
    EngineQuiesceError,
    EngineResumeError,
    OutsideConnectionError,
)

#: exit status when the wait for restore-complete timed out (as timeout(1) uses)
EXIT_RESTORE_TIMEOUT = 124
#: exit status of the source after its snapshot completed
EXIT_SNAPSHOT_COMPLETE = 0

State = Literal["ready", "quiesced", "resumed", "cold"]
ConnectionPolicy = Literal["fail", "warn", "ignore"]


@dataclass(frozen=True)
class EngineOutcome:
    """What `run()` returns when the worker goes on to serve."""

    #: True in a restored copy; False on a cold start (no control dir) or a released source that resumed
    restored: bool
    info: ResumeInfo = field(default_factory=lambda: ResumeInfo(restored=False))
    #: seconds each engine call took, by call name, quiesce and resume in the order they ran
    call_seconds: dict[str, float] = field(default_factory=dict)


def _note_undo_errors(error: BaseException, undo_errors: list[EngineError]) -> None:
    """Say on `error` (the worker's own, raised as it is) that the engine did not come back."""
    for undo_error in undo_errors:
        error.add_note(f"podsnap: undoing the quiesce failed too, the engine is not serving: {undo_error}")


def _exit(status: int) -> NoReturn:
    # os._exit: the engine's atexit teardown (NCCL, process pools) must not run in a process whose
    # copy lives on in the checkpoint; the streams are flushed by hand first
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


class EngineSnapshot:
    """The engine-neutral controller (module docstring). One use per process."""

    def __init__(
        self,
        adapter: EngineAdapter,
        *,
        control: SnapshotControl | None = None,
        timeout_s: float | None = None,
        on_source_released: Literal["exit", "resume"] = "exit",
        on_restore: Callable[[ResumeInfo], object] | None = None,
        outside: ConnectionPolicy = "fail",
        exit: Callable[[int], NoReturn] = _exit,
    ) -> None:
        if on_source_released not in ("exit", "resume"):
            raise ValueError(f"on_source_released={on_source_released!r}: expected 'exit' or 'resume'")
        if outside not in ("fail", "warn", "ignore"):
            raise ValueError(f"outside={outside!r}: expected 'fail', 'warn' or 'ignore'")
        self.adapter = adapter
        self.control = control if control is not None else SnapshotControl()
        self.timeout_s = timeout_s
        self.on_source_released = on_source_released
        self.on_restore = on_restore
        self.outside = outside
        self._exit = exit
        self.state: State = "ready"
        self._seconds: dict[str, float] = {}

    # -- synchronous engines and HTTP admin endpoints ----------------------------------------------
    def run(self) -> EngineOutcome:
        """Quiesce, wait for the capture, and resume (module docstring). Engine calls must not be coroutines."""
        return self._drive(self._call_sync, self._wait_sync)

    # -- engines whose calls are coroutines (vLLM AsyncLLM): run on the engine's event loop ---------
    async def arun(self) -> EngineOutcome:
        """`run()` for coroutine engines: engine calls are awaited on this loop, the wait runs in a thread."""
        if not self.control.enabled:
            self.state = "cold"
            return EngineOutcome(restored=False)
        self._check_outside()
        done: list[Step] = []
        for step in self.adapter.steps():
            try:
                await self._await(step.do, "quiesce")
            except Exception as e:
                raise EngineQuiesceError(self.adapter.engine, step.do.name, e, await self._aundo(done)) from e
            done.append(step)
        self.state = "quiesced"
        info = await self._await_wait(done)
        if not info.restored and self.on_source_released == "exit":
            self._finish(EXIT_SNAPSHOT_COMPLETE, "snapshot complete; the source exits")
        for step in reversed(done):
            for undo in step.undos:
                try:
                    await self._await(undo, "resume")
                except Exception as e:
                    raise EngineResumeError(self.adapter.engine, undo.name, e) from e
        return self._resumed(info)

    # -- the shared sequence ---------------------------------------------------------------------
    def _drive(self, call: Callable[[Call, str], None], wait: Callable[[], ResumeInfo]) -> EngineOutcome:
        if not self.control.enabled:
            self.state = "cold"
            return EngineOutcome(restored=False)
        self._check_outside()
        done: list[Step] = []
        for step in self.adapter.steps():
            try:
                call(step.do, "quiesce")
            except Exception as e:
                raise EngineQuiesceError(self.adapter.engine, step.do.name, e, self._undo(done, call)) from e
            done.append(step)
        self.state = "quiesced"
        try:
            info = wait()
        except RestoreTimeout:
            self._finish(
                EXIT_RESTORE_TIMEOUT, f"no restore within {self.timeout_s:g}s after ready-for-snapshot; exiting"
            )
        except Exception as e:
            # a user hook of the SnapshotControl failed: the engine must not stay asleep
            _note_undo_errors(e, self._undo(done, call))
            raise
        if not info.restored and self.on_source_released == "exit":
            self._finish(EXIT_SNAPSHOT_COMPLETE, "snapshot complete; the source exits")
        for step in reversed(done):
            for undo in step.undos:
                try:
                    call(undo, "resume")
                except Exception as e:
                    raise EngineResumeError(self.adapter.engine, undo.name, e) from e
        return self._resumed(info)

    def _resumed(self, info: ResumeInfo) -> EngineOutcome:
        # os.environ already holds the new pod's context (the SDK applied it before returning)
        if self.on_restore is not None:
            self.on_restore(info)
        self.state = "resumed"
        return EngineOutcome(restored=info.restored, info=info, call_seconds=dict(self._seconds))

    def _finish(self, status: int, message: str) -> NoReturn:
        print(f"podsnap: {self.adapter.engine}: {message}", file=sys.stderr)
        self._exit(status)

    def _check_outside(self) -> None:
        if self.outside == "ignore":
            return
        found = outside_connections()
        if not found:
            return
        error = OutsideConnectionError(self.adapter.engine, found)
        if self.outside == "fail":
            raise error
        print(f"podsnap: warning: {error}", file=sys.stderr)

    def _timed(self, call: Call, result: object, t0: float) -> object:
        self._seconds[call.name] = self._seconds.get(call.name, 0.0) + time.monotonic() - t0
        return result

    def _call_sync(self, call: Call, phase: str) -> None:
        t0 = time.monotonic()
        result = call.fn()
        if inspect.isawaitable(result):
            if asyncio.iscoroutine(result):
                result.close()  # never awaited: do not leave a warning behind
            raise TypeError(
                f"{call.name} returned a coroutine: this engine object is asynchronous; "
                "use `await EngineSnapshot(...).arun()` on the engine's event loop"
            )
        self._timed(call, result, t0)

    def _undo(self, done: list[Step], call: Callable[[Call, str], None]) -> list[EngineError]:
        # the first failure ends the undo: each call assumes the ones before it brought the engine back
        # (no generation resumed on a model whose weights or KV cache did not come back)
        for step in reversed(done):
            for undo in step.undos:
                try:
                    call(undo, "undo")
                except Exception as e:
                    return [EngineResumeError(self.adapter.engine, undo.name, e)]
        return []

    def _wait_sync(self) -> ResumeInfo:
        return self.control.checkpoint_and_wait(timeout_s=self.timeout_s)

    async def _await(self, call: Call, phase: str) -> None:
        t0 = time.monotonic()
        result = call.fn()
        if inspect.isawaitable(result):
            result = await result
        self._timed(call, result, t0)

    async def _aundo(self, done: list[Step]) -> list[EngineError]:
        for step in reversed(done):
            for undo in step.undos:
                try:
                    await self._await(undo, "undo")
                except Exception as e:
                    return [EngineResumeError(self.adapter.engine, undo.name, e)]
        return []

    async def _await_wait(self, done: list[Step]) -> ResumeInfo:
        try:
            return await asyncio.to_thread(self._wait_sync)
        except RestoreTimeout:
            self._finish(
                EXIT_RESTORE_TIMEOUT, f"no restore within {self.timeout_s:g}s after ready-for-snapshot; exiting"
            )
        except Exception as e:
            _note_undo_errors(e, await self._aundo(done))
            raise
