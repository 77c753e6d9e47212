"""Errors of the workload SDK.

SnapshotError
├── ControlDirError       the control dir named by the environment is unusable
├── QuiesceError          a quiesce hook failed; `ready-for-snapshot` was NOT written
├── RestoreTimeout        `restore-complete` did not appear in time
├── RestoreContextError   `restore-context.json` is malformed (the message names the field)
├── ResumeError           a resume hook failed after the restore
└── WeightsError          the cooperative weight path failed (the message names the tensor and the step)
    └── WeightSourceError a weight's file source is missing, changed, short or different (names tensor and file)
"""

from __future__ import annotations


class SnapshotError(RuntimeError):
    """Base of every error the workload SDK raises."""


class ControlDirError(SnapshotError):
    pass


class QuiesceError(SnapshotError):
    def __init__(self, hook: str, cause: BaseException) -> None:
        super().__init__(f"quiesce hook {hook!r} failed: {cause!r}; ready-for-snapshot was not written")
        self.hook = hook


class RestoreTimeout(SnapshotError, TimeoutError):
    pass


class RestoreContextError(SnapshotError, ValueError):
    pass


class ResumeError(SnapshotError):
    def __init__(self, hook: str, cause: BaseException) -> None:
        super().__init__(f"resume hook {hook!r} failed: {cause!r}")
        self.hook = hook


class WeightsError(SnapshotError):
    pass


class WeightSourceError(WeightsError):
    pass
