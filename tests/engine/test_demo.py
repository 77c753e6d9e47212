"""`podsnap demo` on the CPU: the demo worker (numpy) is cold-started, captured, restored, asked again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from podsnap.engine import Criu

pytestmark = pytest.mark.slow


def test_podsnap_demo_keeps_answer_init_id_and_listening_socket(criu: Criu, tmp_path: Path) -> None:
    out = tmp_path / "demo.json"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "podsnap.cli",
            "demo",
            "--device",
            "cpu",
            "--json",
            str(out),
            "--workdir",
            str(tmp_path / "w"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PODSNAP_CRIU": str(criu.binary.exe)},
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    report = json.loads(out.read_text())
    # the second answer came through the same port after the restore: the listening socket came back
    assert report["sameAnswerAndInitId"] is True
    assert report["answerAfterRestore"] == report["answer"] and report["answer"]
    assert report["initIdAfterRestore"] == report["initId"]
    assert report["capture"]["bytesMemory"] > 0
    assert {"criu_dump", "hash", "publish"} <= set(report["capture"]["timingsMs"])
    assert {"verify", "compat", "criu_restore"} <= set(report["restore"]["timingsMs"])
    assert report["restoreOverColdStart"] > 0
    assert "restore / cold start" in p.stdout
    # the restored worker was stopped at the end: nothing left running on its pid
    assert (
        not Path(f"/proc/{report['restore']['pid']}").exists()
        or "Z" in Path(f"/proc/{report['restore']['pid']}/stat").read_text().split()[2]
    )
