"""FakeCudaDriver: a FAKE of the CUDA driver's checkpoint calls, for tests on machines without a GPU. It
is never used outside tests; the engine takes it where it takes the real driver (`cuda=`).

Like the real driver it keeps each process's checkpoint state (RUNNING, LOCKED, CHECKPOINTED) outside
the caller, here one file per PID in `state_dir`, so a capture in one process and a recovery in another
(an agent that died and its successor) see the same state. It refuses the transitions the driver
refuses (CUDA_ERROR_ILLEGAL_STATE), appends every call to `calls.log`, and can stand in for a caller
that dies: `hang_after` names a call after which it blocks forever (the test then kills the process).
What it cannot fake is the GPU: the real sequence runs in tests/gpu on a CUDA machine.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from podsnap.engine import CudaError

RUNNING, LOCKED, CHECKPOINTED = "RUNNING", "LOCKED", "CHECKPOINTED"
#: call -> (the state it needs, the state it leaves)
TRANSITIONS = {
    "lock": (RUNNING, LOCKED),
    "checkpoint": (LOCKED, CHECKPOINTED),
    "restore": (CHECKPOINTED, LOCKED),
    "unlock": (LOCKED, RUNNING),
}
DRIVER_NAMES = {
    "lock": "cuCheckpointProcessLock",
    "checkpoint": "cuCheckpointProcessCheckpoint",
    "restore": "cuCheckpointProcessRestore",
    "unlock": "cuCheckpointProcessUnlock",
}


class FakeCudaDriver:
    """`cuda_pids`: the processes that "hold CUDA state" (registered RUNNING unless already known)."""

    def __init__(
        self, state_dir: Path, cuda_pids: Iterable[int] = (), *, hang_after: str | None = None, fail: str | None = None
    ) -> None:
        self.dir = state_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.hang_after = hang_after
        #: a call that fails like the driver would, leaving the state as it was
        self.fail = fail
        for pid in cuda_pids:
            if not self._file(pid).exists():
                self.set_state(pid, RUNNING)

    def _file(self, pid: int) -> Path:
        return self.dir / f"{pid}.state"

    def set_state(self, pid: int, state: str) -> None:
        self._file(pid).write_text(state)

    def calls(self) -> list[tuple[str, int]]:
        log = self.dir / "calls.log"
        if not log.exists():
            return []
        return [(name, int(pid)) for name, pid in (line.split() for line in log.read_text().splitlines())]

    def available(self) -> bool:
        return True

    def cuda_pids(self, pids: Iterable[int]) -> dict[int, list[str]]:
        return {p: [] for p in pids if self._file(p).exists()}

    def state(self, pid: int) -> str:
        try:
            return self._file(pid).read_text()
        except FileNotFoundError:
            raise CudaError("cuCheckpointProcessGetState", pid, "CUDA_ERROR_NOT_INITIALIZED") from None

    def _call(self, name: str, pid: int) -> None:
        with (self.dir / "calls.log").open("a") as log:
            log.write(f"{name} {pid}\n")
        need, leave = TRANSITIONS[name]
        if name == self.fail or self.state(pid) != need:
            raise CudaError(DRIVER_NAMES[name], pid, "CUDA_ERROR_ILLEGAL_STATE")
        self.set_state(pid, leave)
        if name == self.hang_after:
            while True:  # the caller "dies" here: the test kills it
                time.sleep(3600)

    def lock(self, pid: int, timeout_ms: int = 30_000) -> None:
        self._call("lock", pid)

    def checkpoint(self, pid: int) -> None:
        self._call("checkpoint", pid)

    def restore(self, pid: int, gpu_pairs: Sequence[tuple[str, str]] = ()) -> None:
        self._call("restore", pid)

    def unlock(self, pid: int) -> None:
        self._call("unlock", pid)

    def restore_thread_id(self, pid: int) -> int:
        return pid
