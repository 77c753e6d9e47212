"""A capturing process that dies in the middle, as an agent killed mid-capture does (its CRIU with it):

    python -m tests.support.dying_capture PID OUT JOURNAL CUDA DIE_AT

runs the engine's real capture of PID (real CRIU) with the journal at JOURNAL, and dies at DIE_AT:
`lock` or `checkpoint` (it hangs after that driver call and writes OUT.hung; the test kills it), or
`criu_dump` (once CRIU has written 1 MiB of a pages image it SIGKILLs its own process group, CRIU
included, with the tree seized). CUDA: a directory, for the FAKE driver of tests/support/fake_cuda.py keeping its
state there, or `real` for the host's driver (tests/gpu).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from podsnap.engine import CaptureOptions, CudaCheckpointer, capture, default_checkpointer
from tests.support.fake_cuda import FakeCudaDriver


class HangAfter:
    """The real driver, except that the process hangs after the call `die_at` (then the test kills it)."""

    def __init__(self, inner: CudaCheckpointer, die_at: str, marker: Path) -> None:
        self.inner, self.die_at, self.marker = inner, die_at, marker

    def _after(self, call: str) -> None:
        if call == self.die_at:
            self.marker.write_text(call)
            while True:
                time.sleep(3600)

    def available(self) -> bool:
        return self.inner.available()

    def cuda_pids(self, pids: Iterable[int]) -> dict[int, list[str]]:
        return self.inner.cuda_pids(pids)

    def lock(self, pid: int, timeout_ms: int = 30_000) -> None:
        self.inner.lock(pid, timeout_ms)
        self._after("lock")

    def checkpoint(self, pid: int) -> None:
        self.inner.checkpoint(pid)
        self._after("checkpoint")

    def restore(self, pid: int, gpu_pairs: Sequence[tuple[str, str]] = ()) -> None:
        self.inner.restore(pid, gpu_pairs)

    def unlock(self, pid: int) -> None:
        self.inner.unlock(pid)

    def state(self, pid: int) -> str:
        return self.inner.state(pid)

    def restore_thread_id(self, pid: int) -> int:
        return self.inner.restore_thread_id(pid)


def _die_mid_dump(out: Path) -> None:
    """SIGKILL this process group (CRIU included) once a pages image in `out`'s staging dir has 1 MiB."""
    while True:
        for image in out.parent.glob(f".{out.name}.staging-*/criu/pages-*.img"):
            with contextlib.suppress(OSError):
                if image.stat().st_size >= 1 << 20:
                    os.killpg(0, signal.SIGKILL)
        time.sleep(0.001)


def main(argv: list[str]) -> None:
    pid, out, journal, cuda_arg, die_at = int(argv[0]), Path(argv[1]), Path(argv[2]), argv[3], argv[4]
    hang = die_at if die_at in ("lock", "checkpoint") else None
    marker = out.parent / f"{out.name}.hung"
    out.parent.mkdir(parents=True, exist_ok=True)
    cuda: CudaCheckpointer
    if cuda_arg == "real":
        cuda = HangAfter(default_checkpointer(), hang, marker) if hang else default_checkpointer()
    else:
        cuda = FakeCudaDriver(Path(cuda_arg), hang_after=hang)

    if die_at == "criu_dump":
        # the engine reports the dump's progress every 0.25 s, and a small worker's dump can end sooner:
        # watch the staging dir itself and die as soon as CRIU has written part of a pages image
        threading.Thread(target=_die_mid_dump, args=(out,), daemon=True).start()

    options = CaptureOptions(journal=journal, journal_note={"content": "c-1"})
    capture(pid, out, options, cuda=cuda)
    sys.exit("the capture finished: it was meant to die")


if __name__ == "__main__":
    main(sys.argv[1:])
