"""Entering a container's namespaces to run CRIU there, trusting nothing inside the container.

Namespace mode runs CRIU as root with every capability inside a pod's IPC, UTS, network, PID and mount
namespaces. Every path resolved after the mount namespace was entered is resolved through the
container's mounts, and a workload in a user namespace of its own can own a mount namespace and put
anything at /proc (`unshare -Urm`, then tmpfs over /proc with programs planted at /proc/self/fd/N):
`nsenter -t PID -m ... -- /proc/self/fd/N` ran such a program as host root. So:

1. The target is refused (`Refused`, naming the pid and why) before anything runs unless it is the
   process it was (its start time, when the caller knows it: PID reuse), it is in the agent's own user
   namespace, every namespace entered is owned by the agent's user namespace (so only a holder of
   CAP_SYS_ADMIN over the host, never the workload, can mount anything in that mount namespace, now or
   later), and the mounts at and under its /proc are a genuine procfs with only what container runtimes
   put there (`check_proc_mounts`). Pods with `hostUsers: false` are refused: their namespaces belong to a
   user namespace the pod's root owns.
2. The namespaces are entered through fds opened and checked here (`Target`), so what was checked is
   what is entered, whatever the process does afterwards; the checks run again right before each CRIU.
3. CRIU is exec'd through the O_PATH fd of its binary with execveat(AT_EMPTY_PATH): no executable path
   is resolved inside the container. glibc's fexecve would fall back to exec'ing "/proc/self/fd/N" (in
   the container's /proc) where the kernel answers ENOSYS, so the syscall is made directly.
4. CRIU's `-D`, `-W` and `--config` still have to be paths (`/proc/self/fd/N`; CRIU takes no fd for
   them) and CRIU reads /proc throughout, inside the container: they are only as good as the container's
   /proc, which (1) keeps genuine. Right before the exec, the process that becomes CRIU checks that each
   of those paths, resolved in the container, is the agent's own directory, and stops otherwise.

A container whose processes hold CAP_SYS_ADMIN in the host's user namespace (a privileged pod) can
mount over /proc after these checks; such a pod is root on its node already. The mounts are read from
/proc/PID/mountinfo, which lists them relative to that process's root: the ownership checks, not the
mount list, are what keep a workload that cannot mount (every unprivileged one) from faking /proc.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import platform
import re
import signal
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from podsnap.engine import _journal as journal

#: the namespaces CRIU runs in, in the order entered (nsenter's order: mount last)
NAMESPACES = ("ipc", "uts", "net", "pid", "mnt")
#: ioctl(2) on a namespace fd: an fd of the user namespace that owns it (linux/nsfs.h, _IO(0xb7, 0x1))
NS_GET_USERNS = 0xB701

#: mount points below /proc that runc, containerd and CRI-O mask (an empty read-only tmpfs over a
#: directory, /dev/null bound over a file) ...
_MASKED = frozenset(
    "/proc/" + n
    for n in (
        "acpi", "asound", "interrupts", "kcore", "keys", "latency_stats", "sched_debug", "scsi", "timer_list",
        "timer_stats",
    )
)  # fmt: skip
_MASK_TYPES = frozenset({"tmpfs", "devtmpfs"})
#: ... and bind read-only over themselves (still procfs)
_READ_ONLY = frozenset("/proc/" + n for n in ("bus", "fs", "irq", "sys", "sysrq-trigger"))
#: lxcfs, where a cluster uses it, serves these files from a host daemon
_LXCFS = frozenset(
    "/proc/" + n
    for n in (
        "cpuinfo", "diskstats", "loadavg", "meminfo", "slabinfo", "stat", "swaps", "uptime", "pressure/cpu",
        "pressure/io", "pressure/irq", "pressure/memory",
    )
)  # fmt: skip
#: the NVIDIA container toolkit puts a tmpfs at /proc/driver/nvidia and binds the GPUs' entries into it
_NVIDIA = "/proc/driver/nvidia"
#: a host's own binfmt_misc (an automount), seen by sandboxes that keep the host's mounts (tests, demo)
_BINFMT = "/proc/sys/fs/binfmt_misc"


class Refused(Exception):
    """The target may not be entered; the message names the pid and why."""


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _own_user_ns() -> os.stat_result:
    return Path("/proc/self/ns/user").stat()


def check_same_process(pid: int, expected_start: int | None) -> None:
    """Refuse when `pid` is gone, or (with `expected_start`) now belongs to another process."""
    now = journal.start_time(pid)
    if now is None:
        raise Refused(f"pid {pid} is gone")
    if expected_start is not None and now != expected_start:
        raise Refused(
            f"pid {pid} now belongs to another process (started at tick {now}, expected {expected_start}): "
            "the process it named has exited"
        )


def check_user_ns(pids: Iterable[int]) -> None:
    """Refuse a process that is not in this process's user namespace: it may own mount namespaces."""
    own = _own_user_ns()
    for pid in pids:
        try:
            theirs = Path(f"/proc/{pid}/ns/user").stat()
        except OSError as exc:
            raise Refused(f"cannot read the user namespace of pid {pid}: {exc}") from exc
        if not _same(theirs, own):
            raise Refused(
                f"pid {pid} is in a user namespace of its own, not the host's: a process there can mount over "
                "/proc of a mount namespace it owns, which CRIU would trust. Namespace mode needs pods in the "
                "host's user namespace (not hostUsers: false)"
            )


def check_own_pid_ns(pid: int) -> None:
    """Refuse a target in this process's PID namespace (a hostPID pod): its /proc is the host's, every
    process of the node is there by PID, and CRIU would open what a workload names in it as root."""
    try:
        theirs, own = Path(f"/proc/{pid}/ns/pid").stat(), Path("/proc/self/ns/pid").stat()
    except OSError as exc:
        raise Refused(f"cannot read the PID namespace of pid {pid}: {exc}") from exc
    if _same(theirs, own):
        raise Refused(
            f"pid {pid} is in the host's PID namespace (a hostPID pod): namespace mode needs a pod with a PID "
            "namespace of its own"
        )


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def proc_mount_problem(mountinfo: str) -> str | None:
    """What is wrong with the mounts at and under /proc in a /proc/PID/mountinfo text, or None.

    /proc itself must be procfs, every mount on it too (a sandbox may stack its own on the host's);
    below it only what container runtimes and the NVIDIA toolkit put there, each of its kind. Nothing
    may be mounted at /proc/self, /proc/thread-self or /proc/<pid> (not in any of those lists)."""
    found_proc = False
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        sep = fields.index("-", 6)
        point, fstype = _unescape(fields[4]), fields[sep + 1]
        if point == "/proc":
            if fstype != "proc":
                return f"/proc is a {fstype} mount, not procfs"
            found_proc = True
        elif point.startswith("/proc/"):
            allowed = (
                (point in _MASKED and fstype in _MASK_TYPES)
                or (point in _READ_ONLY and fstype == "proc")
                or (point in _LXCFS and fstype == "fuse.lxcfs")
                or ((point == _NVIDIA or point.startswith(_NVIDIA + "/")) and fstype in ("tmpfs", "proc"))
                or (point == _BINFMT and fstype in ("autofs", "binfmt_misc"))
            )
            if not allowed:
                return f"a {fstype} mount at {point}, which no container runtime puts there"
    return None if found_proc else "no procfs is mounted at /proc"


def check_proc_mounts(pid: int) -> None:
    try:
        text = Path(f"/proc/{pid}/mountinfo").read_text()
    except OSError as exc:
        raise Refused(f"cannot read the mounts of pid {pid}: {exc}") from exc
    problem = proc_mount_problem(text)
    if problem:
        raise Refused(f"the mount namespace of pid {pid} has {problem}: CRIU would resolve its paths through it")


@dataclass
class Target:
    """The namespaces of one process, held open as checked, in the order they are entered."""

    pid: int
    fds: tuple[int, ...]
    #: an O_PATH fd of the target's root directory: CRIU is chrooted there, so that the root its every path
    #: resolution stops at is the container's own (hack/criu-confine.c builds on that), whatever the
    #: runtime made the mount namespace's root
    root: int

    def close(self) -> None:
        for fd in (*self.fds, self.root):
            with contextlib.suppress(OSError):
                if fd >= 0:
                    os.close(fd)
        self.fds, self.root = (), -1


def _check_owner(pid: int, name: str, fd: int, own: os.stat_result) -> None:
    try:
        owner = fcntl.ioctl(fd, NS_GET_USERNS)
    except OSError as exc:
        # EPERM: owned by a user namespace outside ours
        raise Refused(f"cannot tell which user namespace owns the {name} namespace of pid {pid}: {exc}") from exc
    try:
        if not _same(os.fstat(owner), own):
            raise Refused(
                f"the {name} namespace of pid {pid} belongs to a user namespace other than the host's: whoever "
                "owns it can change it (mount over /proc) while CRIU runs there"
            )
    finally:
        os.close(owner)


@contextlib.contextmanager
def target(pid: int, expected_start: int | None = None) -> Iterator[Target]:
    """Open and check the namespaces of `pid` (see the module's doc); raise Refused. Closed afterwards."""
    check_same_process(pid, expected_start)
    check_user_ns([pid])
    check_own_pid_ns(pid)
    own = _own_user_ns()
    fds: list[int] = []
    root = -1
    try:
        try:
            root = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise Refused(f"cannot open the root directory of pid {pid}: {exc}") from exc
        for name in NAMESPACES:
            try:
                fds.append(os.open(f"/proc/{pid}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC))
            except OSError as exc:
                raise Refused(f"cannot open the {name} namespace of pid {pid}: {exc}") from exc
            _check_owner(pid, name, fds[-1], own)
        check_proc_mounts(pid)
        # the fds were opened from whoever had `pid` then: still the expected process means they are its
        check_same_process(pid, expected_start)
        t = Target(pid, tuple(fds), root)
        fds, root = [], -1
        try:
            yield t
        finally:
            t.close()
    finally:
        for fd in fds:
            os.close(fd)
        if root >= 0:
            os.close(root)


def check(pid: int, expected_start: int | None = None, *, tree: Sequence[int] = ()) -> None:
    """Refuse (Refused) a namespace target `pid`, or a `tree` of processes to run CRIU on inside it."""
    with target(pid, expected_start):
        pass
    check_user_ns(tree)


# --- the child side: everything below runs between fork and exec (no imports, no paths but /proc/self/fd)

_libc = ctypes.CDLL(None, use_errno=True)
_NR_EXECVEAT = {"x86_64": 322, "aarch64": 281}.get(platform.machine())
_AT_EMPTY_PATH = 0x1000
_PR_SET_PDEATHSIG = 1
#: a failure between fork and exec: the message goes to CRIU's output, the exit status says who failed
EXIT_REFUSED = 126


def _die(message: str) -> None:
    with contextlib.suppress(OSError):
        os.write(1, f"Error (podsnap): {message}\n".encode())
    os._exit(EXIT_REFUSED)


def _cstrings(items: Sequence[str]) -> ctypes.Array[ctypes.c_char_p]:
    return (ctypes.c_char_p * (len(items) + 1))(*[s.encode() for s in items], None)


def exec_in(
    t: Target,
    exe_fd: int,
    argv: Sequence[str],
    env: dict[str, str],
    *,
    keep_fds: Iterable[int],
    dirs: Iterable[int],
    before: Callable[[], None] | None = None,
) -> Callable[[], None]:
    """A subprocess preexec function that runs the binary of `exe_fd` in `t`'s namespaces instead of the
    command Popen was given, like `nsenter -t PID -i -u -n -p -m` but exec'ing through the fd.

    The Popen child runs `before` (e.g. joining cgroups), enters the namespaces and forks: the grandchild
    is in the target's PID namespace; it verifies that `/proc/self/fd/N` of each of `dirs` is that very
    directory, closes every fd but 0-2 and `keep_fds`, and execs. The child closes everything and waits,
    stopping and continuing with it and exiting with its status (128 + signal when killed), so the Popen
    object is the grandchild's like it was nsenter's; the grandchild dies with it (PR_SET_PDEATHSIG).
    It never returns to Popen, which would exec its command (a path) inside the container."""
    c_argv, c_env = _cstrings(argv), _cstrings([f"{k}={v}" for k, v in env.items()])
    keep = sorted({0, 1, 2, exe_fd, *keep_fds})
    dir_fds = tuple(dirs)
    max_fd = os.sysconf("SC_OPEN_MAX")
    if max_fd <= 0:
        max_fd = 1 << 20

    def close_all_but(kept: list[int]) -> None:
        low = 0
        for fd in kept:
            if fd > low:
                os.closerange(low, fd)
            low = fd + 1
        os.closerange(low, max_fd)

    def grandchild() -> None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # the process root becomes the target's root: no `..` and no absolute symlink CRIU follows for the
        # workload can leave it (magic links are hack/criu-confine.c's)
        if _libc.fchdir(t.root) != 0 or _libc.chroot(b".") != 0:
            _die(f"cannot change root to the root of pid {t.pid}: {os.strerror(ctypes.get_errno())}")
        for fd in dir_fds:
            try:
                seen = os.stat(f"/proc/self/fd/{fd}")  # noqa: PTH116 - between fork and exec: os only
            except OSError as exc:
                _die(f"/proc/self/fd/{fd} inside pid {t.pid}'s mount namespace: {exc}")
            if not _same(seen, os.fstat(fd)):
                _die(f"/proc/self/fd/{fd} inside pid {t.pid}'s mount namespace is not ours: its /proc is not genuine")
        close_all_but(keep)
        if _NR_EXECVEAT is not None:
            _libc.syscall(_NR_EXECVEAT, exe_fd, b"", c_argv, c_env, _AT_EMPTY_PATH)
            err = ctypes.get_errno()
        else:  # glibc's fexecve: execveat, falling back to /proc/self/fd/N only where the kernel lacks it
            try:
                os.execve(exe_fd, list(argv), env)
            except OSError as exc:
                err = exc.errno or errno.EIO
        _die(f"cannot exec criu in the namespaces of pid {t.pid}: {os.strerror(err)}")

    def child() -> None:
        try:
            # nothing of this interpreter may load a module from the container's filesystem from now on:
            # an import fails instead (the modules used below are loaded already)
            sys.meta_path.clear()
            if before is not None:
                before()
            for fd, name in zip(t.fds, NAMESPACES, strict=True):
                if _libc.setns(fd, 0) != 0:
                    _die(f"cannot enter the {name} namespace of pid {t.pid}: {os.strerror(ctypes.get_errno())}")
            # libc's fork, not os.fork: no at-fork hook of the interpreter runs inside the container
            pid = _libc.fork()
            if pid < 0:
                _die(f"cannot fork in the namespaces of pid {t.pid}: {os.strerror(ctypes.get_errno())}")
            if pid == 0:
                grandchild()
            close_all_but([])
            while True:
                _, status = os.waitpid(pid, os.WUNTRACED)
                if os.WIFSTOPPED(status):  # job control, as nsenter: stop with it, continue it with us
                    os.kill(os.getpid(), signal.SIGSTOP)
                    os.kill(pid, signal.SIGCONT)
                    continue
                code = os.waitstatus_to_exitcode(status)
                os._exit(128 - code if code < 0 else code)
        except BaseException as exc:  # never back into Popen
            _die(f"cannot run criu in the namespaces of pid {t.pid}: {exc}")

    return child
