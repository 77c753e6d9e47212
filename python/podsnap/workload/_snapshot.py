"""`SnapshotControl`: what a worker calls after warm-up to be captured, and what brings it back.

Sequence of `checkpoint_and_wait()` (names from `podsnap.contract`):
  1. run the quiesce hooks in registration order (stop generation, free caches, close outgoing sockets);
  2. write `ready-for-snapshot` atomically: the pod turns Ready and the agent captures the process,
     which ends the source here (the checkpoint kills it);
  3. in the restored process, the wait goes on: poll for `restore-complete`;
  4. read `restore-context.json` (the NEW pod's env) and apply it to `os.environ`;
  5. run the resume hooks in registration order; they may do real work (stream weights back to the
     GPU, reconnect) because the worker serves only after this returns.
With no control dir configured every step is skipped: a plain cold start.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from podsnap.contract import RestoreContext
from podsnap.workload import _control_dir
from podsnap.workload._errors import QuiesceError, RestoreTimeout, ResumeError
from podsnap.workload._identity import ProcessIdentity

QuiesceHook = Callable[[], None]


@dataclass(frozen=True)
class ResumeInfo:
    """What a resume hook (and the caller of `checkpoint_and_wait`) learns after the wait ends."""

    #: True when this process is a restored copy; False when the capture was abandoned and the
    #: source itself was released (hooks must still undo what quiesce did), or without a control dir
    restored: bool
    #: the new pod's context, already applied to os.environ
    context: RestoreContext = field(default_factory=RestoreContext)
    #: seconds spent waiting for `restore-complete` (in the restored process: since it came back)
    waited_s: float = 0.0
    #: seconds each hook took, by hook name, in the order they ran
    hook_seconds: Mapping[str, float] = field(default_factory=dict)


ResumeHook = Callable[[ResumeInfo], None]


def _hook_name(fn: Callable[..., object]) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


class SnapshotControl:
    """The worker's side of the control-dir protocol.

    `control_dir=None` reads `SNAPSHOT_CONTROL_DIR` (then `DYN_SNAPSHOT_CONTROL_DIR`) from the
    environment; when neither is set, `enabled` is False and `checkpoint_and_wait()` is a no-op.
    """

    def __init__(
        self,
        control_dir: Path | str | None = None,
        *,
        poll_interval_s: float = 0.05,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        if poll_interval_s <= 0:
            raise ValueError(f"poll_interval_s must be > 0, got {poll_interval_s!r}")
        self.control_dir: Path | None = (
            Path(control_dir) if control_dir is not None else _control_dir.control_dir_from_env(environ)
        )
        self.poll_interval_s = poll_interval_s
        self._quiesce: list[tuple[str, QuiesceHook]] = []
        self._resume: list[tuple[str, ResumeHook]] = []

    @property
    def enabled(self) -> bool:
        return self.control_dir is not None

    def on_quiesce(self, hook: QuiesceHook, *, name: str | None = None) -> QuiesceHook:
        """Run `hook()` before `ready-for-snapshot` is written. Usable as a decorator."""
        self._quiesce.append((name or _hook_name(hook), hook))
        return hook

    def on_resume(self, hook: ResumeHook, *, name: str | None = None) -> ResumeHook:
        """Run `hook(info)` after the restore, before serving resumes. Usable as a decorator."""
        self._resume.append((name or _hook_name(hook), hook))
        return hook

    def checkpoint_and_wait(self, *, timeout_s: float | None = None) -> ResumeInfo:
        """Quiesce, offer this process for capture, and return once it runs again (see module doc).

        `timeout_s` bounds the wait for `restore-complete`; None waits for ever, which is right for a
        capture job whose deadline the operator enforces. Raises RestoreTimeout, QuiesceError,
        RestoreContextError or ResumeError.
        """
        if self.control_dir is None:
            return ResumeInfo(restored=False)
        control_dir = self.control_dir
        _control_dir.clear_stale(control_dir)
        for name, quiesce in self._quiesce:
            try:
                quiesce()
            except Exception as e:
                raise QuiesceError(name, e) from e
        before = ProcessIdentity.current()
        _control_dir.write_ready(control_dir, {"pid": os.getpid(), "time": time.time()})
        # -- the capture happens here; a restored copy of this process continues from this loop --
        waited_s = self._wait_for_complete(control_dir, timeout_s)
        restored = ProcessIdentity.current() != before
        context = _control_dir.read_context(control_dir)
        os.environ.update(context.env)
        info = ResumeInfo(restored=restored, context=context, waited_s=waited_s)
        seconds: dict[str, float] = {}
        for name, resume in self._resume:
            t0 = time.monotonic()
            try:
                resume(info)
            except Exception as e:
                raise ResumeError(name, e) from e
            seconds[name] = time.monotonic() - t0
        return ResumeInfo(restored=restored, context=context, waited_s=waited_s, hook_seconds=seconds)

    def _wait_for_complete(self, control_dir: Path, timeout_s: float | None) -> float:
        """Poll for `restore-complete`; return the seconds this process spent running while it waited.

        The clock is not trusted across the capture: the process is frozen for an unknown time, and a
        restore on another machine sees another monotonic clock. A step far longer than one poll (or a
        negative one) is that gap, and neither counts toward the timeout nor the reported wait.
        """
        complete = _control_dir.complete_path(control_dir)
        max_step = 10 * self.poll_interval_s + 1.0
        waited = 0.0
        last = time.monotonic()
        while not complete.exists():
            if timeout_s is not None and waited > timeout_s:
                raise RestoreTimeout(
                    f"{complete} did not appear within {timeout_s:g}s after ready-for-snapshot was written; "
                    "is a podsnap agent (or `podsnap capture`) serving this control dir?"
                )
            time.sleep(self.poll_interval_s)
            now = time.monotonic()
            step = now - last
            last = now
            if 0.0 <= step <= max_step:
                waited += step
        return waited
