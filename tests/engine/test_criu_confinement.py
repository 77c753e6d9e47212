"""CRIU resolves a workload's paths only inside the container's root (#26, 1).

A tenant's worker is captured in one pod while it holds one of each path CRIU restores by name: an open
file, a shared mapping, its cwd, a listening unix socket and a ghost (open, unlinked) file, all under
/data. Each test restores it into a fresh pod in which one of those directories is a symlink climbing out
of the container: through CRIU's own cwd (`/proc/self/cwd/..`, `/proc/thread-self/cwd/..`, the agent's
work dir before the confinement), `/proc/self/root`, `/proc/1/root`, or an absolute host path. The host
directory it points at holds files of the very size and mode CRIU checks, so a CRIU that followed the
link would open them. Whatever happens, no host file is touched or held: the restore is refused, naming
the path, and nothing is left running in the pod; or it succeeds with everything held inside the pod's
root. The links through a magic link are refused by podsnap's confinement (hack/criu-confine.c) itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from podsnap.engine import CaptureOptions, Criu, CriuOptions, RestoreError, RestoreOptions, capture, restore
from podsnap.engine import _proctree as proctree
from tests.support.root_pods import Programs, Report, RootPod, alive, bare_root
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

AGENT_CRIU = CriuOptions(tcp="close")
KINDS = ("open", "map", "cwd", "sock", "ghost")
#: how a symlink in the restore pod climbs to `host` (an absolute path of the host), by name
ESCAPES: dict[str, Callable[[str], str]] = {
    "proc-self-cwd": lambda host: "/proc/self/cwd/" + "../" * 32 + host.lstrip("/"),
    "proc-thread-self-cwd": lambda host: "/proc/thread-self/cwd/" + "../" * 32 + host.lstrip("/"),
    "proc-self-root": lambda host: "/proc/self/root/" + host.lstrip("/"),
    "proc-1-root": lambda host: "/proc/1/root/" + host.lstrip("/"),
    "absolute": lambda host: host,
}
#: the escapes through a magic link: refused by the confinement, whatever is behind them
MAGIC = ("proc-self-cwd", "proc-thread-self-cwd")


def data_dirs(root: Path) -> None:
    """/data as the tenant worker expects it (isolation_helper.c: hold_paths)."""
    for kind in KINDS:
        (root / "data" / kind).mkdir(parents=True, exist_ok=True)
    files(root / "data")


def files(top: Path) -> None:
    """The files CRIU reopens, with the sizes and modes it checks: an empty 0600 file and one 4 KiB page."""
    f = top / "open" / "f"
    f.write_bytes(b"")
    f.chmod(0o600)
    m = top / "map" / "f"
    m.write_bytes(b"\0" * 4096)
    m.chmod(0o644)


@dataclass(frozen=True)
class Captured:
    artifact: Path
    before: Report


@pytest.fixture(scope="module")
def captured(criu: Criu, programs: Programs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Captured]:
    """One capture of the tenant, restored by every test (a restore leaves its artifact as it was)."""
    top = tmp_path_factory.mktemp("confinement")
    root = bare_root(top / "src", programs)
    data_dirs(root)
    pod = RootPod(root)
    try:
        _, host_pid, token = pod.start_worker("tenant")
        before = pod.ask(host_pid)
        assert before.token == token
        art = top / "host-only" / "snap"
        art.parent.mkdir()
        capture(host_pid, art, CaptureOptions(namespace_pid=pod.init_pid, criu=AGENT_CRIU), criu=criu)
        wait_for(lambda: not alive(host_pid), what="the dumped tenant to go", timeout=20, interval=0.02)
        yield Captured(art, before)
    finally:
        pod.stop()


def host_tree(host: Path) -> dict[str, tuple[int, int, int, str]]:
    """Everything under `host`: kind, size, mtime and the bytes' digest of each entry (no link followed)."""
    seen = {}
    for p in [host, *sorted(host.rglob("*"))]:
        st = p.lstat()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if stat.S_ISREG(st.st_mode) else ""
        seen[str(p.relative_to(host))] = (stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns, digest)
    return seen


def host_inodes(host: Path) -> set[tuple[int, int]]:
    return {(p.lstat().st_dev, p.lstat().st_ino) for p in [host, *host.rglob("*")]}


def held(pid: int) -> dict[str, tuple[int, int]]:
    """What `pid` holds by path, seen from the host: its fds, file mappings, cwd and root."""
    out: dict[str, tuple[int, int]] = {}
    proc = Path(f"/proc/{pid}")
    links = [proc / "cwd", proc / "root"]
    for sub in ("fd", "map_files"):
        with contextlib.suppress(OSError):
            links += list((proc / sub).iterdir())
    for link in links:
        with contextlib.suppress(OSError):
            st = link.stat()
            out[f"{link.relative_to(proc)} -> {link.readlink()}"] = (st.st_dev, st.st_ino)
    return out


def in_pod(init_pid: int) -> list[int]:
    """The processes of the pod's PID namespace but its init."""
    want = proctree.pid_ns(init_pid)
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != init_pid:
            with contextlib.suppress(OSError):
                if proctree.pid_ns(int(entry.name)) == want:
                    found.append(int(entry.name))
    return found


@pytest.mark.parametrize("escape", sorted(ESCAPES))
@pytest.mark.parametrize("kind", KINDS)
def test_a_symlink_climbing_out_of_the_restore_pod_reaches_no_host_file(
    criu: Criu, programs: Programs, captured: Captured, tmp_path: Path, *, kind: str, escape: str
) -> None:
    host = tmp_path / "host-only"
    for k in KINDS:
        (host / k).mkdir(parents=True)
    files(host)
    (host / kind / "secret").write_text("host-only\n")
    root = bare_root(tmp_path / "dst", programs)
    data_dirs(root)
    target = root / "data" / kind
    for p in sorted(target.iterdir()):
        p.unlink()
    target.rmdir()
    target.symlink_to(ESCAPES[escape](str(host / kind)))
    before, inodes = host_tree(host), host_inodes(host)
    pod = RootPod(root)
    try:
        try:
            restored = restore(
                captured.artifact,
                RestoreOptions(namespace_pid=pod.init_pid, criu=AGENT_CRIU, log_dir=tmp_path / "logs"),
                criu=criu,
            )
        except RestoreError as exc:
            message = str(exc)
            assert f"data/{kind}" in message, f"the reason names the path: {message}"
            if escape in MAGIC:
                assert "(podsnap confine)" in message, message
            wait_for(lambda: in_pod(pod.init_pid) == [], what="nothing left running in the pod", timeout=20)
        else:
            assert escape not in MAGIC, "a path through a magic link must never be restored"
            try:
                for pid in restored.pids:
                    reached = {what for what, ident in held(pid).items() if ident in inodes}
                    assert reached == set(), f"the restored tenant holds host files: {reached}"
            finally:
                for pid in restored.pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, 9)
    finally:
        pod.stop()
    assert host_tree(host) == before, "a host file was created, changed or removed"
