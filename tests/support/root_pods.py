"""Pods with a root filesystem of their own for the engine's namespace-mode attack tests.

A `RootPod` is a sandbox whose mount namespace has a directory as its root (pivot_root, like a container
runtime), with its own PID, UTS and IPC namespaces (host network) and a static init that reaps orphans.
Its programs (init, worker, tenant, trojans) are one static binary built from tests/engine/isolation_helper.c
by the session fixture `programs`; `make_pod` starts pods and stops them after the test.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.tools import REPO
from tests.support.waiting import wait_for

SOURCE = REPO / "tests" / "engine" / "isolation_helper.c"


@dataclass(frozen=True)
class Programs:
    helper: Path  # static: pod init, worker, spawner, and every trojan program
    evil_so: Path  # a shared object whose constructor records that it ran
    interp: Path  # an ELF interpreter that records that it ran


@pytest.fixture(scope="session")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Programs:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc not installed (apt-get install build-essential)")
    out = tmp_path_factory.mktemp("isolation-programs")
    builds = {
        "helper": ["-static"],
        "evil.so": ["-DNOLIBC", "-shared", "-fPIC", "-nostdlib"],
        "interp": ["-DNOLIBC", "-static", "-nostdlib"],
    }
    for name, flags in builds.items():
        r = subprocess.run(
            [gcc, "-O1", "-Wall", "-Werror", *flags, "-o", str(out / name), str(SOURCE)],
            capture_output=True,
            text=True,
            check=False,
        )
        if r.returncode != 0:
            pytest.skip(f"cannot build the test programs (gcc -static needs libc6-dev): {r.stderr.strip()[:200]}")
    return Programs(out / "helper", out / "evil.so", out / "interp")


def install(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dst)


def bare_root(root: Path, progs: Programs) -> Path:
    """A container root filesystem with one static program and no libc, loader or shell."""
    for d in ("proc", "state", "pwned", "run", "tmp"):
        (root / d).mkdir(parents=True, exist_ok=True)
    install(progs.helper, root / "bin" / "podtest")
    return root


def pid_in_pod(ns_pid: int, init_pid: int) -> int:
    """The host PID of `ns_pid` in the PID namespace of `init_pid` (from /proc/*/status NSpid)."""
    want = Path(f"/proc/{init_pid}/ns/pid").stat().st_ino
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            fields = next(
                ln.split()[1:] for ln in (entry / "status").read_text().splitlines() if ln.startswith("NSpid:")
            )
            if len(fields) >= 2 and int(fields[-1]) == ns_pid and (entry / "ns" / "pid").stat().st_ino == want:
                return int(entry.name)
    raise LookupError(f"no process {ns_pid} in the PID namespace of {init_pid}")


def state(pid: int) -> str:
    """The process state letter of `pid` (R, S, T, Z...), or "gone"."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def alive(pid: int) -> bool:
    return state(pid) not in ("Z", "gone")


@dataclass(frozen=True)
class Report:
    token: str
    checksum: str
    count: int


class RootPod:
    """A pod-like sandbox whose mount namespace has `root` as its root (like a container's), with its own
    PID, UTS and IPC namespaces (host network) and a static init that reaps orphans."""

    def __init__(self, root: Path) -> None:
        self.root = root
        log, pidfile = root.parent / f"{root.name}.log", root.parent / f"{root.name}.unshare.pid"
        cmd = (
            f"echo $$ > {pidfile}; exec unshare --pid --mount --uts --ipc --fork "
            f"{root}/bin/podtest pod {root} </dev/null >{log} 2>&1"
        )
        subprocess.run(["setsid", "-f", "sh", "-c", cmd], check=True)
        wait_for(
            lambda: "pod ready" in (log.read_text() if log.exists() else ""),
            what="the pod to start",
            timeout=20,
            interval=0.02,
        )
        self.unshare_pid = int(pidfile.read_text())
        children = Path(f"/proc/{self.unshare_pid}/task/{self.unshare_pid}/children").read_text().split()
        self.init_pid = int(children[0])

    def start_worker(self, mode: str = "worker") -> tuple[int, int, str]:
        """A worker inside (`mode`: worker or tenant, see isolation_helper.c), re-parented to the pod's init:
        (namespace PID, host PID, its random token)."""
        r = subprocess.run(
            ["nsenter", "-t", str(self.init_pid), "-m", "-u", "-i", "-n", "-p", "--", "/bin/podtest", "spawn", mode],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        assert r.returncode == 0, r.stderr
        ready = self.root / "state" / "ready"
        wait_for(ready.exists, what="the worker to start", timeout=20, interval=0.02)
        token, ns_pid = ready.read_text().split()
        assert int(ns_pid) == int(r.stdout)
        return int(ns_pid), pid_in_pod(int(ns_pid), self.init_pid), token

    def ask(self, host_pid: int) -> Report:
        """Have the worker report its token, a checksum of its memory and how often it was asked."""
        report = self.root / "state" / "report"
        seen = len(report.read_text().splitlines()) if report.exists() else 0
        os.kill(host_pid, signal.SIGUSR1)
        wait_for(
            lambda: report.exists() and len(report.read_text().splitlines()) > seen,
            what="the worker's report",
            timeout=20,
            interval=0.02,
        )
        token, checksum, count = report.read_text().splitlines()[-1].split()
        return Report(token, checksum, int(count))

    def markers(self) -> list[str]:
        return sorted(p.name for p in (self.root / "pwned").iterdir())

    def stop(self) -> None:
        for pid in (self.unshare_pid, self.init_pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # the init dying takes the whole PID namespace with it


MakePod = Callable[[Path], RootPod]


@pytest.fixture
def make_pod() -> Iterator[MakePod]:
    pods: list[RootPod] = []

    def make(root: Path) -> RootPod:
        pods.append(RootPod(root))
        return pods[-1]

    yield make
    for pod in pods:
        pod.stop()
