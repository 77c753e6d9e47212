"""The chart's seccomp profile filters a real process: loaded by libseccomp as runc loads a Localhost
profile (tests/support/seccomp_exec.py), a Python worker runs (threads, asyncio, subprocesses, sockets,
mmap) while making a user namespace and io_uring fail. The profile the chart shipped before (allow
everything but io_uring) is run too: the attack works under it, so these tests would catch it coming back."""

from __future__ import annotations

import ctypes.util
import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.chart.conftest import REPO, Docs, find

#: what the chart shipped before (docs/security.md: "Capture pods' seccomp profile")
PERMISSIVE = {
    "defaultAction": "SCMP_ACT_ALLOW",
    "syscalls": [
        {"names": ["io_uring_setup", "io_uring_enter", "io_uring_register"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}
    ],
}

#: a worker's everyday work, then each forbidden call; prints one JSON line of what happened
PROBE = r"""
import asyncio, ctypes, errno, json, mmap, os, socket, subprocess, tempfile, threading

libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *args):
    rc = libc.syscall(nr, *args)
    return 0 if rc >= 0 else errno.errorcode[ctypes.get_errno()]

out = {}
box = []
t = threading.Thread(target=lambda: box.append(sum(range(1000))))
t.start(); t.join()
out["thread"] = box == [499500]
async def main():
    r, w = socket.socketpair()
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(w, b"ping")
    return await loop.sock_recv(r, 4)
out["asyncio"] = asyncio.run(main()) == b"ping"
m = mmap.mmap(-1, 1 << 20); m[:5] = b"hello"; out["mmap"] = m[:5] == b"hello"
with tempfile.NamedTemporaryFile() as f:
    f.write(b"x" * 4096); f.flush(); out["file"] = os.path.getsize(f.name) == 4096
out["subprocess"] = subprocess.run(["true"]).returncode == 0
# x86_64 numbers: unshare 272, clone 56, setns 308, mount 165, keyctl 250, bpf 321, io_uring_setup 425
CLONE_NEWUSER, CLONE_NEWNS, SIGCHLD = 0x10000000, 0x00020000, 17
pid = libc.syscall(56, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0)
if pid == 0:
    os._exit(0)
out["clone(CLONE_NEWUSER)"] = errno.errorcode[ctypes.get_errno()] if pid < 0 else (os.waitpid(pid, 0), 0)[1]
out["unshare(CLONE_NEWUSER)"] = call(272, CLONE_NEWUSER)  # last: inside a new user namespace, more would fail
out["keyctl"] = call(250, 0, -3, 0)  # KEYCTL_GET_KEYRING_ID of the session keyring
out["io_uring_setup"] = call(425, 8, ctypes.create_string_buffer(120))
print(json.dumps(out))
"""

pytestmark = pytest.mark.skipif(ctypes.util.find_library("seccomp") is None, reason="needs libseccomp.so.2")


def run_under(profile: dict, tmp_path: Path, *cmd: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    return subprocess.run(
        [sys.executable, "-m", "tests.support.seccomp_exec", str(path), *cmd],
        cwd=REPO,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


def chart_profile(default_docs: Docs) -> dict:
    return json.loads(find(default_docs, "ConfigMap", "podsnap-seccomp")["data"]["profile.json"])


def probe(profile: dict, tmp_path: Path) -> dict[str, object]:
    proc = run_under(profile, tmp_path, sys.executable, "-c", PROBE)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the probe uses x86_64 syscall numbers")
def test_a_python_worker_runs_under_the_profile_but_gets_no_user_namespace_keys_or_io_uring(
    default_docs: Docs, tmp_path: Path
) -> None:
    old = probe(PERMISSIVE, tmp_path)
    assert old["unshare(CLONE_NEWUSER)"] == 0 and old["clone(CLONE_NEWUSER)"] == 0, f"the attack failed anyway: {old}"
    got = probe(chart_profile(default_docs), tmp_path)
    assert got == {
        "thread": True,  # glibc's clone3 gets ENOSYS and falls back to clone, as under RuntimeDefault
        "asyncio": True,
        "mmap": True,
        "file": True,
        "subprocess": True,
        "unshare(CLONE_NEWUSER)": "EPERM",
        "clone(CLONE_NEWUSER)": "EPERM",
        "keyctl": "EPERM",
        "io_uring_setup": "ENOSYS",  # ENOSYS, so io_uring users fall back to plain I/O
    }


def test_unshare_of_a_user_namespace_fails_under_the_profile_and_worked_under_the_old_one(
    default_docs: Docs, tmp_path: Path
) -> None:
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1)")
    old = run_under(PERMISSIVE, tmp_path, unshare, "-U", "-r", "true")
    if old.returncode != 0:
        pytest.skip(f"this host refuses user namespaces anyway: {old.stderr.strip()}")
    new = run_under(chart_profile(default_docs), tmp_path, unshare, "-U", "-r", "true")
    assert new.returncode != 0
    assert "Operation not permitted" in new.stderr, new.stderr
