"""CRIU in namespace mode runs nothing a workload controls, and sees no directory of the agent (#10, 1).

The agent runs CRIU inside a container's namespaces, as root with every capability. These tests build
"pods" with their own root filesystem (pivot_root, like a container runtime), attack CRIU through
that filesystem, and check that a capture and a restore still round-trip a worker:
- a hostile root: /etc/ld.so.preload, a planted ELF interpreter and libc, CRIU plugins, an NSS module,
  and trojan sh/iptables/ip/tar/apparmor_parser programs, each recording when it runs; a planted
  kdat cache and CRIU config files;
- a root with no libc at all (the worker and the pod's init are one static binary);
- the descriptors of the running CRIU process: none is a directory of the agent's mount namespace
  other than the images and work dirs.
The programs (worker, init, trojans) come from isolation_helper.c, compiled here with gcc.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from podsnap.engine import (
    CaptureOptions,
    Criu,
    CriuBinary,
    CriuError,
    CriuOptions,
    RestoreOptions,
    capture,
    restore,
)
from tests.support.root_pods import MakePod, Programs, RootPod, alive, bare_root, install, pid_in_pod, state
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

AGENT_CRIU = CriuOptions(tcp="close")
#: every name CRIU may execute (kerndat, network locking, net ns, tmpfs, AppArmor, action scripts)
TROJAN_NAMES = (
    "sh",
    "iptables",
    "ip6tables",
    "iptables-restore",
    "ip6tables-restore",
    "iptables-save",
    "iptables-legacy",
    "iptables-nft",
    "ip",
    "tar",
    "apparmor_parser",
)
TROJAN_DIRS = ("bin", "sbin", "usr/bin", "usr/sbin", "usr/local/bin", "usr/local/sbin")
PLANTED_KDAT = b"podsnap-test: CRIU must neither read nor replace a kerndat cache of the container\n"


def hostile_root(root: Path, progs: Programs) -> Path:
    """A bare root plus everything a workload could plant for a process that enters it as root."""
    bare_root(root, progs)
    (root / "etc").mkdir()
    (root / "etc" / "ld.so.preload").write_text("/lib/podsnap-evil.so\n")
    install(progs.evil_so, root / "lib" / "podsnap-evil.so")
    install(progs.interp, root / "lib64" / "ld-linux-x86-64.so.2")
    install(progs.interp, root / "lib" / "x86_64-linux-gnu" / "ld-linux-x86-64.so.2")
    for libdir in ("lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib64"):
        for lib in ("libc.so.6", "libprotobuf-c.so.1", "libnl-3.so.200", "libnet.so.1", "libnss_evil.so.2"):
            install(progs.evil_so, root / libdir / lib)
    for plugins in ("usr/lib/criu", "usr/local/lib/criu", "usr/lib64/criu"):
        install(progs.evil_so, root / plugins / "podsnap-evil.so")
    (root / "etc" / "nsswitch.conf").write_text(
        "".join(f"{db}: evil\n" for db in ("hosts", "protocols", "services", "passwd", "group"))
    )
    for d in TROJAN_DIRS:
        for name in TROJAN_NAMES:
            install(progs.helper, root / d / name)
    # CRIU reads these unless told otherwise; an action script would run a trojan
    for conf in ("etc/criu/default.conf", "root/.criu/default.conf"):
        (root / conf).parent.mkdir(parents=True, exist_ok=True)
        (root / conf).write_text("action-script /bin/sh\nlib /usr/lib/criu\n")
    (root / "run" / "criu.kdat").write_bytes(PLANTED_KDAT)
    return root


def _round_trip(criu: Criu, src: RootPod, dst: RootPod, art: Path) -> None:
    _, host_pid, token = src.start_worker()
    before = src.ask(host_pid)
    assert before.token == token and before.count == 1
    capture(host_pid, art, CaptureOptions(namespace_pid=src.init_pid, criu=AGENT_CRIU), criu=criu)
    wait_for(lambda: not alive(host_pid), what="the dumped worker to go", timeout=20, interval=0.02)
    restored = restore(art, RestoreOptions(namespace_pid=dst.init_pid, criu=AGENT_CRIU), criu=criu)
    after = dst.ask(restored.pid)
    assert (after.token, after.checksum) == (before.token, before.checksum), "memory came back bit-exact"
    assert after.count == before.count + 1, "and the worker carried on from where it was"


def test_a_hostile_container_root_never_gets_code_into_criu(
    criu: Criu, programs: Programs, make_pod: MakePod, tmp_path: Path
) -> None:
    src = make_pod(hostile_root(tmp_path / "src", programs))
    dst = make_pod(hostile_root(tmp_path / "dst", programs))
    host_only = tmp_path / "host-only"
    host_only.mkdir()

    _round_trip(criu, src, dst, host_only / "snap")

    for pod in (src, dst):
        assert pod.markers() == [], f"CRIU ran code planted in {pod.root.name}'s root: {pod.markers()}"
        kdat = pod.root / "run" / "criu.kdat"
        assert kdat.read_bytes() == PLANTED_KDAT, "CRIU read (and replaced) the container's kerndat cache"
        assert sorted(p.name for p in (pod.root / "run").iterdir()) == ["criu.kdat"]


def test_a_container_root_without_any_libc_round_trips(
    criu: Criu, programs: Programs, make_pod: MakePod, tmp_path: Path
) -> None:
    src = make_pod(bare_root(tmp_path / "src", programs))
    dst = make_pod(bare_root(tmp_path / "dst", programs))
    for pod in (src, dst):
        assert not any(p.name.startswith(("libc.so", "ld-linux")) for p in pod.root.rglob("*")), "no libc, no loader"
    host_only = tmp_path / "host-only"
    host_only.mkdir()
    _round_trip(criu, src, dst, host_only / "snap")


@dataclass
class FdSample:
    """What one CRIU process held, seen from here: every descriptor, its cwd and its root."""

    pid: int
    fds: dict[int, tuple[str, os.stat_result, int]] = field(default_factory=dict)  # fd -> (link, stat, mnt_id)
    mounts: set[int] = field(default_factory=set)  # mount IDs of CRIU's own mount namespace
    cwd: os.stat_result | None = None
    root: os.stat_result | None = None


class CriuWatcher:
    """Stops each CRIU process this test starts (a child of its nsenter) as soon as it runs CRIU's binary,
    records its descriptors, and lets it go on."""

    def __init__(self, criu_exe: Path) -> None:
        self.exe = criu_exe.stat()
        self.samples: list[FdSample] = []
        self._seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CriuWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _candidates(self) -> Iterator[int]:
        me = os.getpid()
        for task in Path(f"/proc/{me}/task").iterdir():
            with contextlib.suppress(OSError):
                for child in (task / "children").read_text().split():
                    with contextlib.suppress(OSError):
                        yield from (int(g) for g in Path(f"/proc/{child}/task/{child}/children").read_text().split())

    def _is_criu(self, pid: int) -> bool:
        try:
            st = Path(f"/proc/{pid}/exe").stat()
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == (self.exe.st_dev, self.exe.st_ino)

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid in self._candidates():
                if pid not in self._seen and self._is_criu(pid):
                    self._seen.add(pid)
                    # a CRIU that ended before it was sampled leaves samples short: the test says so
                    with contextlib.suppress(OSError):
                        self._sample(pid)
            time.sleep(0.001)

    def _sample(self, pid: int) -> None:
        nsenter = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_for(lambda: state(pid) == "T", what="CRIU to stop", timeout=20, interval=0.02)
            sample = FdSample(pid)
            for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
                sample.mounts.add(int(line.split()[0]))
            for entry in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    link = str(entry.readlink())
                    info = Path(f"/proc/{pid}/fdinfo/{entry.name}").read_text()
                    mnt = int(next(ln.split()[1] for ln in info.splitlines() if ln.startswith("mnt_id:")))
                    sample.fds[int(entry.name)] = (link, entry.stat(), mnt)
            sample.cwd = Path(f"/proc/{pid}/cwd").stat()
            sample.root = Path(f"/proc/{pid}/root").stat()
            self.samples.append(sample)
        finally:
            # nsenter stops itself when its child stops, and continues the child once it is continued
            with contextlib.suppress(AssertionError):  # wait_for times out with AssertionError
                wait_for(
                    lambda: state(nsenter) in ("T", "gone"),
                    what="nsenter to follow its child",
                    timeout=5,
                    interval=0.02,
                )
            for p in (nsenter, pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGCONT)


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def test_criu_holds_no_directory_of_the_agent_but_the_images_and_work_dirs(
    criu: Criu, programs: Programs, make_pod: MakePod, tmp_path: Path
) -> None:
    src = make_pod(bare_root(tmp_path / "src", programs))
    dst = make_pod(bare_root(tmp_path / "dst", programs))
    agent = tmp_path / "agent"
    images, dump_work, restore_work = agent / "images", agent / "dump-work", agent / "restore-work"
    for d in (images, dump_work, restore_work):
        d.mkdir(parents=True)
    ns_pid, host_pid, _ = src.start_worker()
    before = src.ask(host_pid)

    with CriuWatcher(criu.binary.exe) as watcher:
        criu.dump(ns_pid, images, dump_work, AGENT_CRIU, namespace_pid=src.init_pid)
        wait_for(lambda: not alive(host_pid), what="the dumped worker to go", timeout=20, interval=0.02)
        restored_ns_pid = criu.restore(images, restore_work, AGENT_CRIU, namespace_pid=dst.init_pid)
    assert restored_ns_pid == ns_pid
    assert dst.ask(pid_in_pod(ns_pid, dst.init_pid)).checksum == before.checksum

    assert len(watcher.samples) == 2, "the watcher saw the dump's CRIU and the restore's"
    for sample, pod, work in zip(watcher.samples, (src, dst), (dump_work, restore_work), strict=True):
        pod_root = pod.root.stat()
        assert sample.root is not None and _same(sample.root, pod_root), "CRIU's root is the container's"
        assert sample.cwd is not None
        assert _same(sample.cwd, pod_root) or _same(sample.cwd, work.stat()), "cwd: the container's root or -W"
        allowed = {"images": images.stat(), "work": work.stat()}
        agent_dirs: dict[int, str] = {}
        for fd, (link, st, mnt) in sample.fds.items():
            if mnt in sample.mounts or not stat.S_ISDIR(st.st_mode):
                continue  # the container's own files, or not a directory
            agent_dirs[fd] = next((name for name, a in allowed.items() if _same(st, a)), link)
        assert set(agent_dirs.values()) == {"images", "work"}, (
            f"CRIU (pid {sample.pid}) holds directories of the agent's mount namespace: {agent_dirs}"
        )
        others = [
            link
            for link, st, mnt in sample.fds.values()
            if mnt not in sample.mounts
            and link.startswith("/")
            and not stat.S_ISDIR(st.st_mode)
            and not (stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3))  # stdin: /dev/null
            and not _same(st, criu.binary.exe.stat())
            and not link.startswith((f"{images}/", f"{work}/"))
        ]
        assert others == [], f"CRIU holds files of the agent's mount namespace: {others}"


def test_namespace_mode_refuses_a_dynamically_linked_criu(tmp_path: Path) -> None:
    dynamic = Path(shutil.which("true") or "/bin/true").resolve()
    runner = Criu(CriuBinary(dynamic))
    with pytest.raises(CriuError, match="static") as err:
        runner.dump(1, tmp_path / "images", tmp_path / "work", AGENT_CRIU, namespace_pid=os.getpid())
    assert str(dynamic) in str(err.value)


LOOPBACK_PAIR = """
import os, signal, socket, sys
# SIGUSR1 stays blocked and is taken by sigwait: a signal.pause() loop would miss one that arrives before
# it is back in pause() (a tree resumed with SIGCONT and signalled at once hits exactly that window)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen()
client = socket.create_connection(server.getsockname())
peer, _ = server.accept()
out = sys.argv[1]
with open(sys.argv[2] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(sys.argv[2] + ".tmp", sys.argv[2])
while True:
    signal.sigwait({signal.SIGUSR1})
    client.sendall(b"ping")
    with open(out + ".tmp", "w") as f:
        f.write(peer.recv(4).decode())
    os.rename(out + ".tmp", out)
"""


def test_an_established_connection_is_dumped_without_running_any_program(criu: Criu, tmp_path: Path) -> None:
    """CRIU would lock a live connection with iptables; podsnap's CRIU runs no program, so it is told not to."""
    script, out, pidfile = tmp_path / "pair.py", tmp_path / "out", tmp_path / "pid"
    script.write_text(LOOPBACK_PAIR)
    subprocess.run(
        ["setsid", "-f", sys.executable, str(script), str(out), str(pidfile)],
        check=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for(pidfile.exists, what="the connected pair to start", timeout=20, interval=0.02)
    pid = int(pidfile.read_text())
    try:
        result = capture(pid, tmp_path / "art", CaptureOptions(cuda="off"), criu=criu)
        assert "tcp-established" in result.manifest.criu_options
        assert "refused to run" not in (tmp_path / "art" / "logs" / "dump.log").read_text()
        wait_for(lambda: not alive(pid), what="the dumped pair to go", timeout=20, interval=0.02)
        restored = restore(tmp_path / "art", criu=criu)
        os.kill(restored.pid, signal.SIGUSR1)
        wait_for(out.exists, what="a ping over the restored connection", timeout=20, interval=0.02)
        assert out.read_text() == "ping"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
