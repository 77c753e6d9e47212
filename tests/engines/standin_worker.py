"""A worker process around an engine STAND-IN:
`python -m tests.engines.standin_worker JOURNAL [TIMEOUT_S|-] [MODE]` (MODE: the vLLM adapter's mode).

It runs the real controller with the vLLM adapter on a recording stand-in engine; every engine call
is appended to JOURNAL as it happens, and "serving" once `run()` returned (it never does when the
controller exits the process).
"""

from __future__ import annotations

import sys
from pathlib import Path

from podsnap.workload.engines import EngineSnapshot
from podsnap.workload.engines.vllm import VllmAdapter
from tests.engines.standin import Journal, VllmEngineStandIn


class FileJournal(Journal):
    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def add(self, event: str) -> None:
        super().add(event)
        with self.path.open("a") as f:
            f.write(event + "\n")


def main() -> int:
    journal = FileJournal(Path(sys.argv[1]))
    timeout = float(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] != "-" else None
    mode = sys.argv[3] if len(sys.argv) > 3 else "kv"
    EngineSnapshot(VllmAdapter(VllmEngineStandIn(journal), mode=mode), timeout_s=timeout).run()  # type: ignore[arg-type]
    journal.add("serving")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
