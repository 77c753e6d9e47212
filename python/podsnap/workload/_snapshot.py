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

from podsnap import controldir
from podsnap.contract import FILE_RESTORE_COMPLETE, RestoreContext
from podsnap.controldir import ControlDir
from podsnap.workload import _control_dir
from podsnap.workload._errors import ControlDirError, QuiesceError, RestoreContextError, RestoreTimeout, ResumeError
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
        RestoreContextError, ResumeError or ControlDirError.
        """
        if self.control_dir is None:
            return ResumeInfo(restored=False)
        ctl = ControlDir(self.control_dir)
        try:
            ctl.clear_stale()
        except controldir.ControlDirError as e:
            raise ControlDirError(str(e)) from e
        for name, quiesce in self._quiesce:
            try:
                quiesce()
            except Exception as e:
                raise QuiesceError(name, e) from e
        before = ProcessIdentity.current()
        ctl.write_ready({"pid": os.getpid(), "time": time.time()})
        # -- the capture happens here; a restored copy of this process continues from this loop --
        try:
            waited_s = ctl.wait_for(FILE_RESTORE_COMPLETE, timeout_s=timeout_s, poll_s=self.poll_interval_s)
        except controldir.ControlDirTimeout as e:
            raise RestoreTimeout(
                f"{ctl}/{FILE_RESTORE_COMPLETE} did not appear within {timeout_s:g}s after ready-for-snapshot was "
                "written; is a podsnap agent (or `podsnap restore --control-dir`) serving this control dir?"
            ) from e
        restored = ProcessIdentity.current() != before
        try:
            context = ctl.read_context()
        except controldir.InvalidRestoreContext as e:
            raise RestoreContextError(str(e)) from e
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
