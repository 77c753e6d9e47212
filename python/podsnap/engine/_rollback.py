"""What a failed capture or restore must undo, recorded by each phase as it succeeds.

One object per workflow run. Phases append to it (a CUDA pid locked, a staging dir made, a process
restored) and take back what no longer needs undoing (after a successful dump the source is gone:
its CUDA state lives in the image). `undo()` runs everything left, newest first, and never raises: it
returns what could not be undone so the error can say so.
"""

from __future__ import annotations

from podsnap.engine import _proctree as proctree
from podsnap.engine._artifact import Staging
from podsnap.engine._cuda import CudaCheckpointer
from podsnap.engine.errors import CudaError


class Rollback:
    def __init__(self, cuda: CudaCheckpointer | None = None) -> None:
        self.cuda = cuda
        #: host pids whose CUDA state this run locked / checkpointed (capture)
        self.locked: list[int] = []
        self.checkpointed: list[int] = []
        #: the capture's staging dir, discarded on failure
        self.staging: Staging | None = None
        #: host pids this run restored (restore), killed on failure: nothing half-restored may run
        self.restored: list[int] = []

    def resume_cuda(self) -> list[str]:
        """Give the source its CUDA state back (restore, then unlock); return what could not be undone."""
        problems = []
        if self.cuda is not None:
            for pid in reversed(self.checkpointed):
                try:
                    self.cuda.restore(pid)
                except CudaError as exc:
                    problems.append(str(exc))
            for pid in reversed(self.locked):
                try:
                    self.cuda.unlock(pid)
                except CudaError as exc:
                    problems.append(str(exc))
        self.forget_cuda()
        return problems

    def forget_cuda(self) -> None:
        """The CUDA state left with the source (its dump succeeded): nothing to give back any more."""
        self.locked, self.checkpointed = [], []

    def undo(self) -> list[str]:
        if self.restored:
            proctree.kill_tree(self.restored)
            self.restored = []
        if self.staging is not None:
            self.staging.discard()
            self.staging = None
        return self.resume_cuda()
