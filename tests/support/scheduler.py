"""A real kube-scheduler for the operator suite, scheduling only the pods that name SCHEDULER_NAME: a test
that needs the scheduler's own verdict on a pod (node affinity, placement) sets that pod's schedulerName,
and every other pod of the session stays where the tests bind it by hand (tests/support/harness.py)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import yaml

from tests.support.tools import require_tool

SCHEDULER_NAME = "podsnap-test-scheduler"


@contextlib.contextmanager
def scheduler(kubeconfig: Path, workdir: Path) -> Iterator[Path]:
    """kube-scheduler against the control plane of `kubeconfig` while the block runs; yields its log file."""
    binary = require_tool("kube-scheduler")
    config = {
        "apiVersion": "kubescheduler.config.k8s.io/v1beta1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": SCHEDULER_NAME}],
    }
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "scheduler.yaml").write_text(yaml.safe_dump(config))
    log = workdir / "scheduler.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [binary, "--config", str(workdir / "scheduler.yaml"), "--port=0", "--secure-port=0"],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield log
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
