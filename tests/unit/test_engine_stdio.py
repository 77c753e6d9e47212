"""A pod's worker writes to its container's log pipes: capture records them, restore hands over the new pod's.

Real processes and pipes; CRIU's side (`inherit-fd`) is exercised by the cluster e2e and namespace tests.
"""

from __future__ import annotations

import os
import subprocess
import sys

from podsnap.engine import proctree


def test_capture_records_the_stdio_pipes_of_a_process_and_restore_opens_the_new_ones() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        recorded = proctree.stdio_pipes(proc.pid)
        assert recorded == {
            "1": f"pipe:[{os.fstat(proc.stdout.fileno()).st_ino}]",
            "2": f"pipe:[{os.fstat(proc.stderr.fileno()).st_ino}]",
        }, "stdin is /dev/null, not a pipe: only the pipes are recorded"
        # the "placeholder" here is the same process: its fd 1 and 2 are the pipes a restore must hand over
        opened = proctree.open_stdio_like(proc.pid, {"1": "pipe:[111]", "2": "pipe:[222]", "0": "pipe:[333]"})
        try:
            assert sorted(opened.values()) == ["pipe:[111]", "pipe:[222]"], "fd 0 is not a pipe there: skipped"
            by_key = {key: fd for fd, key in opened.items()}
            os.write(by_key["pipe:[111]"], b"to the new pod's log\n")
            assert proc.stdout.readline() == b"to the new pod's log\n"
        finally:
            for fd in opened:
                os.close(fd)
    finally:
        proc.kill()
        proc.wait()
