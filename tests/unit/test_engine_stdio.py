"""A pod's worker writes to its container's log pipes: capture records them, restore hands over the new pod's.

Real processes and pipes; CRIU's side (`inherit-fd`) is exercised by the cluster e2e and namespace tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from podsnap.engine import _proctree as proctree


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


def test_a_manifest_cannot_smuggle_a_criu_option_through_the_recorded_pipes(tmp_path: Path) -> None:
    """The recorded pipe ids become `inherit-fd` lines of CRIU's config: a newline would add an option."""
    from podsnap.engine import ArtifactError, Manifest, ProcInfo, RestoreOptions
    from podsnap.engine._host import HostFacts
    from podsnap.engine._options import Timer
    from podsnap.engine._restore import _Run, _stdio_inherit
    from podsnap.engine._rollback import Rollback

    def run_with(stdio: dict[str, str]) -> _Run:
        manifest = Manifest(
            source=HostFacts("h", "x86_64", "6.1", "glibc 2.36", 1, 1),
            processes=(ProcInfo(pid=9, ns_pid=9, ppid=1, comm="w", cmdline=()),),
            cuda_pids=(),
            cuda_gpu_uuids=(),
            files=(),
            namespaced=True,
            extra={proctree.STDIO_KEY: stdio},
        )
        return _Run(tmp_path, manifest, RestoreOptions(namespace_pid=os.getpid()), Timer(None), Rollback())

    for bad in ({"1": "pipe:[1]\naction-script /tmp/evil"}, {"7": "pipe:[1]"}, {"1": "socket:[1]"}):
        with pytest.raises(ArtifactError, match=r"extra\.stdio"):
            _stdio_inherit(run_with(bad))
