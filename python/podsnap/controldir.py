"""The control directory: where a worker and whoever captures/restores it meet (names in `podsnap.contract`).

ONE implementation for every writer and reader: the workload SDK (inside the worker), the node agent
(from the host, into a container), the `podsnap` CLI and the demo round trip.

    ctl = ControlDir("/snapshot-control")                     # the worker's own view, or the CLI's
    ctl = ControlDir.in_root("/proc/1234/root", "/snapshot-control")   # the agent's view of a container

    ctl.clear_stale()                        # worker, before offering itself
    ctl.write_ready({"pid": os.getpid()})    # worker: `ready-for-snapshot`
    ctl.wait_for(FILE_READY_FOR_SNAPSHOT, timeout_s=60)   # capturer
    ctl.signal_restored({"POD_IP": ...})     # restorer: `restore-context.json`, then `restore-complete`
    ctl.read_context()                       # worker, after the wait

Every write is atomic and durable: a temporary file is created beside the target (O_CREAT|O_EXCL|
O_NOFOLLOW), written, fsynced, renamed onto the final name, and the directory is fsynced. A reader (the
worker, a probe's `cat`) sees nothing or everything. `restore-complete` is written last.

`in_root` is for a directory inside a root this process does not trust (a container's, reached through
/proc/PID/root): the directory is opened with openat2(RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS |
RESOLVE_NO_MAGICLINKS), so no symlink the container planted, in the directory's path or as the
directory itself, can send the write elsewhere, and every file operation is relative to that
directory's file descriptor. A planted symlink at a file name is replaced by the rename, never
followed. openat2 needs Linux >= 5.6; without it `in_root` refuses (UnsafeControlDir) rather than fall
back to path-based writes.

Dependency-free (stdlib + `podsnap.contract`): the SDK and the CLI import it without the engine.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import json
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path

from podsnap.contract import (
    ENV_CONTROL_DIR,
    ENV_CONTROL_DIR_DYNAMO,
    FILE_READY_FOR_SNAPSHOT,
    FILE_RESTORE_COMPLETE,
    FILE_RESTORE_CONTEXT,
    RestoreContext,
)

__all__ = [
    "ControlDir",
    "ControlDirError",
    "ControlDirMissing",
    "ControlDirTimeout",
    "InvalidRestoreContext",
    "UnsafeControlDir",
    "control_dir_from_env",
    "openat2_available",
]

# --- errors -----------------------------------------------------------------------------------


class ControlDirError(OSError):
    """Base of the control dir's errors (an OSError: callers that handle I/O failures handle these)."""


class ControlDirMissing(ControlDirError, FileNotFoundError):
    """The control directory does not exist (the control volume is not mounted, or the path is wrong)."""


class UnsafeControlDir(ControlDirError, PermissionError):
    """The directory could not be reached safely: a symlink on the way, or openat2 unavailable."""


class ControlDirTimeout(ControlDirError, TimeoutError):
    """A file did not appear within the timeout."""


class InvalidRestoreContext(ControlDirError, ValueError):
    """`restore-context.json` is malformed; the message names the file and the field."""


# --- openat2 ----------------------------------------------------------------------------------

#: openat2(2) is syscall 437 on every architecture (it came after the syscall tables were unified)
SYS_OPENAT2 = 437
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10
OPENAT2_KERNEL = "Linux >= 5.6"


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


@functools.cache
def _syscall() -> Callable[..., int]:
    fn: Callable[..., int] = ctypes.CDLL(None, use_errno=True).syscall
    return fn


def openat2(dir_fd: int, path: str, flags: int, resolve: int, mode: int = 0) -> int:
    """openat2(2) through libc's syscall(); raises OSError with the kernel's errno."""
    how = _OpenHow(flags, mode, resolve)
    fn = _syscall()
    fd = fn(
        ctypes.c_long(SYS_OPENAT2),
        ctypes.c_int(dir_fd),
        ctypes.c_char_p(os.fsencode(path)),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int(fd)


def openat2_available() -> bool:
    """Whether this kernel (and any seccomp filter around us) lets openat2 through."""
    try:
        fd = openat2(-100, "/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, RESOLVE_NO_MAGICLINKS)  # AT_FDCWD
    except OSError:
        return False
    os.close(fd)
    return True


# --- the directory ----------------------------------------------------------------------------


def control_dir_from_env(environ: Mapping[str, str] | None = None) -> Path | None:
    """The control dir the environment names (podsnap's variable first, then Dynamo's), or None.

    None means "no snapshot machinery here": the worker simply cold-starts and serves. A name that is
    not a directory raises ControlDirMissing naming the variable.
    """
    env = os.environ if environ is None else environ
    for name in (ENV_CONTROL_DIR, ENV_CONTROL_DIR_DYNAMO):
        value = env.get(name, "").strip()
        if not value:
            continue
        path = Path(value)
        if not path.is_dir():
            raise ControlDirMissing(
                f"{name}={value}: not a directory; mount the snapshot control volume there or unset {name}"
            )
        return path
    return None


class ControlDir:
    """One control directory, reached either directly (`ControlDir(path)`) or safely inside a root (`in_root`).

    Nothing is held open between calls: each operation opens the directory, acts relative to its file
    descriptor, and closes it (a worker is checkpointed while it polls, and a held descriptor would be
    carried into the image).
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._root: Path | None = None
        self._rel = ""

    @classmethod
    def in_root(cls, root: Path | str, container_path: str) -> ControlDir:
        """The directory `container_path` as seen inside `root` (e.g. /proc/PID/root), symlinks refused."""
        rel = container_path.strip("/")
        if not rel:
            raise ValueError(f"control dir {container_path!r}: must name a directory below the root, not the root")
        self = cls(Path(root) / rel)
        self._root = Path(root)
        self._rel = rel
        return self

    def __repr__(self) -> str:
        if self._root is not None:
            return f"ControlDir.in_root({str(self._root)!r}, '/{self._rel}')"
        return f"ControlDir({str(self.path)!r})"

    def __str__(self) -> str:
        return str(self.path)

    # -- opening -------------------------------------------------------------------------------

    def _missing(self, e: OSError, detail: str = "") -> ControlDirMissing:
        return ControlDirMissing(
            f"control directory {self} is missing{detail}: is the snapshot control volume mounted there? ({e.strerror})"
        )

    @contextmanager
    def _dir(self) -> Iterator[int]:
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
        if self._root is None:
            try:
                fd = os.open(self.path, flags)
            except (FileNotFoundError, NotADirectoryError) as e:
                raise self._missing(e) from e
        else:
            fd = self._open_in_root(flags)
        try:
            yield fd
        finally:
            os.close(fd)

    def _open_in_root(self, flags: int) -> int:
        assert self._root is not None
        try:
            root_fd = os.open(self._root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError) as e:
            raise self._missing(e, f"; its root {self._root} is gone (has the process exited?)") from e
        try:
            return openat2(root_fd, self._rel, flags, RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
        except OSError as e:
            if e.errno == errno.ENOSYS:
                raise UnsafeControlDir(
                    f"cannot reach control dir {self} safely: openat2 is unavailable ({OPENAT2_KERNEL} needed, "
                    "and no seccomp filter blocking it); refusing a path-based write into a container",
                ) from e
            if e.errno == errno.ELOOP:
                raise UnsafeControlDir(
                    f"control dir {self}: a symlink inside the container's root is on the way; refusing to follow it",
                ) from e
            if e.errno in (errno.ENOENT, errno.ENOTDIR):
                raise self._missing(e) from e
            raise
        finally:
            os.close(root_fd)

    # -- primitives ----------------------------------------------------------------------------

    def write_file(self, name: str, data: bytes) -> None:
        """Write `name` atomically and durably (see the module doc); a symlink at `name` is replaced."""
        _check_name(name)
        with self._dir() as dfd:
            tmp = f".{name}.tmp.{os.getpid()}.{secrets.token_hex(4)}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
            try:
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except BaseException:
                with suppress(OSError):
                    os.unlink(tmp, dir_fd=dfd)
                raise
            os.fsync(dfd)

    def read_file(self, name: str) -> bytes | None:
        """The content of `name`, or None when absent. A symlink there is refused (UnsafeControlDir)."""
        _check_name(name)
        with self._dir() as dfd:
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dfd)
            except FileNotFoundError:
                return None
            except OSError as e:
                if e.errno == errno.ELOOP:
                    raise UnsafeControlDir(f"{self}/{name} is a symlink; refusing to follow it") from e
                raise
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise UnsafeControlDir(f"{self}/{name} is not a regular file")
                chunks = []
                while chunk := os.read(fd, 1 << 16):
                    chunks.append(chunk)
                return b"".join(chunks)
            finally:
                os.close(fd)

    def exists(self, name: str) -> bool:
        """Whether `name` is present (whatever it is; a symlink counts, and is not followed)."""
        _check_name(name)
        with self._dir() as dfd:
            try:
                os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                return False
            return True

    def remove(self, *names: str) -> None:
        for name in names:
            _check_name(name)
        with self._dir() as dfd:
            for name in names:
                with suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=dfd)

    def wait_for(
        self,
        name: str,
        *,
        timeout_s: float | None,
        poll_s: float = 0.05,
        on_poll: Callable[[float], None] | None = None,
    ) -> float:
        """Poll until `name` exists; return the seconds this process spent running while it waited.

        The clock is not trusted across a checkpoint: a process frozen mid-wait (for an unknown time, and
        on another machine with another monotonic clock) sees one huge or negative step; such a step
        counts neither toward `timeout_s` nor toward the returned wait. `on_poll(waited_s)` runs after
        every poll (progress, or raise to stop: e.g. the worker died). ControlDirTimeout after
        `timeout_s` (None: wait for ever).
        """
        if poll_s <= 0:
            raise ValueError(f"poll_s must be > 0, got {poll_s!r}")
        max_step = 10 * poll_s + 1.0
        waited = 0.0
        last = time.monotonic()
        while not self.exists(name):
            if timeout_s is not None and waited > timeout_s:
                raise ControlDirTimeout(f"{self}/{name} did not appear within {timeout_s:g} s")
            time.sleep(poll_s)
            now = time.monotonic()
            step = now - last
            last = now
            if 0.0 <= step <= max_step:
                waited += step
            if on_poll is not None:
                on_poll(waited)
        return waited

    # -- the protocol --------------------------------------------------------------------------

    def clear_stale(self) -> None:
        """Remove what a previous life left behind, so an old `restore-complete` cannot end a wait at once."""
        self.remove(FILE_RESTORE_COMPLETE, FILE_RESTORE_CONTEXT, FILE_READY_FOR_SNAPSHOT)

    def write_ready(self, info: Mapping[str, object] | None = None) -> None:
        """`ready-for-snapshot` (a JSON object: pid, time, ... for people and logs; readers need only presence)."""
        self.write_file(FILE_READY_FOR_SNAPSHOT, (json.dumps(dict(info or {}), sort_keys=True) + "\n").encode())

    def signal_restored(self, env: Mapping[str, str] | None = None) -> None:
        """Write `restore-context.json` (the new pod's env), then `restore-complete`: the worker resumes."""
        self.write_file(FILE_RESTORE_CONTEXT, (RestoreContext(env=dict(env or {})).to_json() + "\n").encode())
        self.write_file(FILE_RESTORE_COMPLETE, b"1\n")

    def read_context(self) -> RestoreContext:
        """The new pod's context; an absent file means an empty one (a restore on the same host needs none)."""
        data = self.read_file(FILE_RESTORE_CONTEXT)
        if data is None:
            return RestoreContext()
        where = f"{self}/{FILE_RESTORE_CONTEXT}"
        try:
            return RestoreContext.from_json(data.decode())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise InvalidRestoreContext(
                f'{where}: not valid JSON ({e}); expected {{"version": 1, "env": {{...}}}}'
            ) from e
        except ValueError as e:
            raise InvalidRestoreContext(f"{where}: {e}") from e


def _check_name(name: str) -> None:
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"control file name {name!r}: must be a plain file name")
