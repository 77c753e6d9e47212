"""CRIU (>= 4) driven through a config file it writes; optionally run inside a target's namespaces.

Binary lookup: `PODSNAP_CRIU`, then `.tools/bin/criu` of this checkout, then `criu` on PATH. A
bundle wrapper (`criu.sh` next to a `criu` ELF and `lib/`, as `make setup` builds) is unwrapped so the
ELF can be run directly with `LD_LIBRARY_PATH`, which namespace mode needs.

Namespace mode (`namespace_pid`): CRIU runs as `nsenter -t PID -m -u -i -n -p -- CRIU ...`, so it
sees the target's mounts, PID namespace and network exactly as the workload does: the dump needs no
external mounts, and a restore lands in the destination's PID namespace (re-parented to its PID 1)
with the same namespace PIDs. CRIU itself, its libraries, the images and the work dir are NOT made
visible in the target's mount namespace: they are opened here as O_PATH directory descriptors that
the nsenter child inherits, and CRIU is pointed at `/proc/self/fd/N/...`. Nothing is mounted, so
the workload can never see them. CRIU still runs with the destination's dynamic loader and libc, so
the container's glibc must be at least the one CRIU was built against (2.36 for `make setup`'s build).
Running it through this host's loader instead (`ld.so --library-path ... criu`) was tried and fails
at restore: /proc/self/exe is then ld.so, which the restored process maps too, and the restorer's
PR_SET_MM_MAP gets EBUSY. A static CRIU build would lift the glibc requirement.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from podsnap.engine.errors import CriuError

MIN_MAJOR = 4
REPO_ROOT = Path(__file__).resolve().parents[3]
LOG_TAIL_LINES = 30
#: libraries that must come from the container itself (they must match its dynamic loader)
GLIBC_LIB = re.compile(r"/(libc|libm|libpthread|libdl|librt|libresolv|ld-linux[^/]*)[.-]")

TcpMode = Literal["established", "close"]
CgroupMode = Literal["soft", "ignore", "full", "strict", "props", "none"]


@dataclass(frozen=True)
class CriuOptions:
    """What CRIU is told, as config-file lines. Defaults suit a container's worker process."""

    shell_job: bool = True
    #: established: dump and restore live TCP connections; close: drop them (a new pod IP cannot keep them)
    tcp: TcpMode = "established"
    file_locks: bool = True
    ext_unix_sk: bool = True
    link_remap: bool = True
    #: None picks "ignore" in namespace mode (the restorer joins the destination's cgroups) and "soft" otherwise
    manage_cgroups: CgroupMode | None = None
    #: declare the target's network namespace external at dump; join `RestoreOptions.net_ns` at restore
    external_net_ns: bool = False
    log_level: int = 4
    #: more config lines as CRIU's long options without dashes, e.g. "ghost-limit 64M"
    extra: tuple[str, ...] = field(default_factory=tuple)
    timeout_s: float = 1800.0

    def _cgroups(self, namespaced: bool) -> str:
        return self.manage_cgroups or ("ignore" if namespaced else "soft")

    def common_lines(self, namespaced: bool) -> list[str]:
        lines = []
        if self.shell_job:
            lines.append("shell-job")
        lines.append("tcp-established" if self.tcp == "established" else "tcp-close")
        if self.file_locks:
            lines.append("file-locks")
        if self.ext_unix_sk:
            lines.append("ext-unix-sk")
        # one word with "=": CRIU's config parser turns each word into an argv entry, and getopt does not
        # take the next entry as the value of an optional-argument option, so "manage-cgroups ignore"
        # silently meant the default mode (soft), which mounts a cgroup yard a pod's mount ns refuses
        lines.append(f"manage-cgroups={self._cgroups(namespaced)}")
        return lines

    def dump_lines(self, namespaced: bool, *, net_ns_inode: int | None = None) -> list[str]:
        lines = self.common_lines(namespaced)
        if self.link_remap:
            lines.append("link-remap")
        if self.external_net_ns and net_ns_inode is not None:
            lines.append(f"external net[{net_ns_inode}]:{EXTERNAL_NET_KEY}")
        return [*lines, *self.extra]

    def restore_lines(self, namespaced: bool, *, net_ns_fd: int | None = None) -> list[str]:
        lines = self.common_lines(namespaced)
        if self.external_net_ns and net_ns_fd is not None:
            lines.append(f"inherit-fd fd[{net_ns_fd}]:{EXTERNAL_NET_KEY}")
        return [*lines, *self.extra]


EXTERNAL_NET_KEY = "podsnap-netns"


@dataclass(frozen=True)
class CriuBinary:
    """How to run CRIU: `exe` (an ELF, or a wrapper script usable only on the host) and its `lib_dir`."""

    exe: Path
    lib_dir: Path | None = None

    @property
    def is_elf(self) -> bool:
        with self.exe.open("rb") as f:
            return f.read(4) == b"\x7fELF"

    def env(self, lib_dir: str | None = None) -> dict[str, str]:
        env = dict(os.environ)
        lib = lib_dir or (str(self.lib_dir) if self.lib_dir else None)
        if lib:
            env["LD_LIBRARY_PATH"] = lib + (f":{env['LD_LIBRARY_PATH']}" if env.get("LD_LIBRARY_PATH") else "")
        return env


def _unwrap(path: Path) -> CriuBinary:
    real = path.resolve()
    with real.open("rb") as f:
        head = f.read(4)
    if head == b"\x7fELF":
        lib = real.parent / "lib"
        return CriuBinary(real, lib if lib.is_dir() else None)
    # a bundle wrapper: run its ELF directly (so namespace mode can reach it through a directory fd)
    for name in ("criu", "criu.bin"):
        elf = real.parent / name
        if elf != real and elf.is_file():
            with elf.open("rb") as f:
                if f.read(4) == b"\x7fELF":
                    lib = real.parent / "lib"
                    return CriuBinary(elf, lib if lib.is_dir() else None)
    return CriuBinary(real, None)


def find_binary(explicit: str | os.PathLike[str] | None = None) -> CriuBinary:
    """Locate CRIU: explicit path, `PODSNAP_CRIU`, `.tools/bin/criu`, PATH; raise CriuError with the fix."""
    candidates: list[tuple[str, str | None]] = [
        ("argument", str(explicit) if explicit else None),
        ("PODSNAP_CRIU", os.environ.get("PODSNAP_CRIU")),
        (".tools/bin/criu", str(REPO_ROOT / ".tools" / "bin" / "criu")),
        ("PATH", shutil.which("criu")),
    ]
    for source, value in candidates:
        if not value:
            continue
        path = Path(value)
        if path.is_file() and os.access(path, os.X_OK):
            return _unwrap(path)
        if source in ("argument", "PODSNAP_CRIU"):
            raise CriuError(f"CRIU not found at {value} (from {source}): point it at a criu >= 4 binary")
    raise CriuError("CRIU not found (PODSNAP_CRIU, .tools/bin/criu, PATH): run `make setup` to build CRIU 4")


def bytes_read(pid: int) -> int:
    """Bytes `pid` and its descendants have read so far (/proc/PID/io rchar): CRIU's restore progress."""
    total = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{p}/io").read_text().splitlines():
                if line.startswith("rchar:"):
                    total += int(line.split()[1])
            for task in Path(f"/proc/{p}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
    return total


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """Error lines first (they say why), then the last `lines` lines (they say where)."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"(no CRIU log at {path}: {exc})"
    errors = [ln for ln in text if "Error" in ln][-10:]
    tail = text[-lines:]
    picked = [*errors, "...", *tail] if errors and errors[-1] not in tail else tail
    return "\n".join(picked)


@contextlib.contextmanager
def _dir_fds(paths: list[Path]) -> Iterator[list[int]]:
    fds: list[int] = []
    try:
        for p in paths:
            fds.append(os.open(p, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
        yield fds
    finally:
        for fd in fds:
            os.close(fd)


def _join_cgroups_of(pid: int) -> Callable[[], None]:
    """A preexec function moving the child into every cgroup of `pid` (v1 and v2), best effort."""
    targets: list[str] = []
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, ctrl, path = line.split(":", 2)
        if ctrl == "":
            roots = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        elif ctrl.startswith("name="):
            roots = [f"/sys/fs/cgroup/{ctrl[5:]}"]
        else:
            roots = [f"/sys/fs/cgroup/{ctrl}", *(f"/sys/fs/cgroup/{c}" for c in ctrl.split(","))]
        for root in roots:
            procs = f"{root}{path}/cgroup.procs"
            if Path(procs).exists():
                targets.append(procs)
                break

    def join() -> None:
        me = str(os.getpid()).encode()
        for procs in targets:
            with contextlib.suppress(OSError):
                fd = os.open(procs, os.O_WRONLY)
                try:
                    os.write(fd, me)
                finally:
                    os.close(fd)

    return join


class Criu:
    """One CRIU installation. Every failure raises CriuError with the log tail."""

    def __init__(self, binary: CriuBinary | None = None) -> None:
        self.binary = binary or find_binary()
        self._version: str | None = None
        self._ns_libs: Path | None = None

    def _host_cmd(self, *args: str) -> list[str]:
        return [str(self.binary.exe), *args]

    def version(self) -> str:
        """CRIU's version ("4.2.1"); raise CriuError when older than 4 or not runnable."""
        if self._version is None:
            try:
                out = subprocess.run(
                    self._host_cmd("--version"),
                    check=False,
                    capture_output=True,
                    text=True,
                    timeout=30,
                    env=self.binary.env(),
                )
            except OSError as exc:
                raise CriuError(f"cannot run {self.binary.exe}: {exc} (run `make setup`)") from exc
            m = re.search(r"Version:\s*(\d+)\.(\d+)(?:\.(\d+))?", out.stdout)
            if out.returncode != 0 or not m:
                raise CriuError(f"{self.binary.exe} --version failed: {(out.stdout + out.stderr).strip()[:300]}")
            if int(m.group(1)) < MIN_MAJOR:
                raise CriuError(
                    f"CRIU {m.group(0).split()[-1]} is too old: podsnap needs CRIU >= {MIN_MAJOR} (run `make setup`)"
                )
            self._version = ".".join(g for g in m.groups() if g is not None)
        return self._version

    def namespace_lib_dir(self) -> Path | None:
        """A directory with every library CRIU needs beyond glibc, to reach it inside a container.

        The bundle's `lib/` when there is one; otherwise (e.g. a distribution's criu) the libraries `ldd`
        resolves here are copied once into a private cache dir, since the container has none of them
        and only glibc may come from the container (its loader must match its libc).
        """
        if self.binary.lib_dir is not None:
            return self.binary.lib_dir
        if self._ns_libs is None:
            out = subprocess.run(
                ["ldd", str(self.binary.exe)],
                check=False,
                capture_output=True,
                text=True,
                timeout=30,
                env=self.binary.env(),
            )
            libs = [
                Path(parts[2])
                for parts in (line.split() for line in out.stdout.splitlines())
                if len(parts) >= 3 and parts[1] == "=>" and parts[2].startswith("/") and not GLIBC_LIB.search(parts[2])
            ]
            missing = [line.split()[0] for line in out.stdout.splitlines() if "not found" in line]
            if missing:
                raise CriuError(f"{self.binary.exe} needs libraries not found here: {', '.join(missing)}")
            st = self.binary.exe.stat()
            key = f"{self.binary.exe}:{st.st_size}:{st.st_mtime_ns}".encode()
            cache = Path(tempfile.gettempdir()) / f"podsnap-criu-libs-{hashlib.sha256(key).hexdigest()[:12]}"
            if not cache.is_dir():
                stage = Path(tempfile.mkdtemp(prefix=cache.name + ".", dir=cache.parent))
                for lib in libs:
                    shutil.copy2(lib, stage / lib.name)
                with contextlib.suppress(OSError):  # a concurrent copy may have won; either is complete
                    stage.rename(cache)
                shutil.rmtree(stage, ignore_errors=True)
            self._ns_libs = cache
        return self._ns_libs

    def check(self) -> tuple[bool, str]:
        """`criu check`: (passed, its output)."""
        out = subprocess.run(
            self._host_cmd("check"), check=False, capture_output=True, text=True, timeout=60, env=self.binary.env()
        )
        text = (out.stdout + out.stderr).strip()
        return out.returncode == 0 and "Looks good" in text, text

    def _run(
        self,
        action: str,
        lines: list[str],
        args: list[str],
        images_dir: Path,
        work_dir: Path,
        *,
        namespace_pid: int | None,
        join_cgroups: bool,
        pass_fds: tuple[int, ...],
        timeout_s: float,
        log_level: int,
        monitor: Callable[[int], None] | None,
    ) -> None:
        self.version()
        work_dir.mkdir(parents=True, exist_ok=True)
        conf = work_dir / f"{action}.conf"
        conf.write_text("".join(f"{ln}\n" for ln in lines))
        log = work_dir / f"{action}.log"
        with contextlib.suppress(FileNotFoundError):
            log.unlink()
        dirs = [self.binary.exe.parent, images_dir, work_dir]
        ns_libs = self.namespace_lib_dir() if namespace_pid is not None else None
        if ns_libs is not None:
            dirs.append(ns_libs)
        with _dir_fds(dirs if namespace_pid is not None else []) as fds:
            if namespace_pid is None:
                exe, img, wrk, lib = str(self.binary.exe), str(images_dir), str(work_dir), None
                prefix: list[str] = []
            else:
                if not self.binary.is_elf:
                    raise CriuError(f"{self.binary.exe} is a wrapper script: namespace mode needs the CRIU ELF")
                exe = f"/proc/self/fd/{fds[0]}/{self.binary.exe.name}"
                img, wrk = f"/proc/self/fd/{fds[1]}", f"/proc/self/fd/{fds[2]}"
                lib = f"/proc/self/fd/{fds[3]}" if ns_libs is not None else None
                prefix = ["nsenter", "-t", str(namespace_pid), "-m", "-u", "-i", "-n", "-p", "--"]
            cmd = [
                *prefix,
                exe,
                action,
                "--no-default-config",
                "--config",
                f"{wrk}/{conf.name}",
                "-D",
                img,
                "-W",
                wrk,
                "-o",
                log.name,
                f"-v{int(log_level)}",
                *args,
            ]
            preexec = _join_cgroups_of(namespace_pid) if (namespace_pid is not None and join_cgroups) else None
            try:
                proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    env=self.binary.env(lib),
                    pass_fds=(*fds, *pass_fds),
                    preexec_fn=preexec,  # noqa: PLW1509 - only writes our pid to cgroup.procs before exec
                )
            except OSError as exc:
                raise CriuError(f"cannot start criu {action}: {exc}") from exc
            output = self._wait(proc, action, timeout_s, monitor)
        if proc.returncode != 0:
            if "GLIBC_" in output and namespace_pid is not None:
                output += (
                    "\nhint: the container's glibc is older than the one CRIU was built against; "
                    "use a CRIU built statically or against an older glibc"
                )
            raise CriuError(
                f"criu {action} exited with {proc.returncode}"
                + (f" (namespaces of pid {namespace_pid})" if namespace_pid else "")
                + (f"; output: {output.strip()[-500:]}" if output.strip() else ""),
                log_tail=log_tail(log),
                returncode=proc.returncode,
            )

    @staticmethod
    def _wait(
        proc: subprocess.Popen[bytes], action: str, timeout_s: float, monitor: Callable[[int], None] | None
    ) -> str:
        chunks: list[bytes] = []
        assert proc.stdout is not None
        stdout = proc.stdout
        reader = threading.Thread(target=lambda: chunks.append(stdout.read()), daemon=True)
        reader.start()
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None:
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise CriuError(f"criu {action} did not finish within {timeout_s:.0f} s: killed it")
            if monitor is not None:
                monitor(proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.25)
        reader.join(timeout=5)
        return b"".join(chunks).decode(errors="replace")

    def dump(
        self,
        pid: int,
        images_dir: Path,
        work_dir: Path,
        options: CriuOptions,
        *,
        namespace_pid: int | None = None,
        leave_running: bool = False,
        net_ns_inode: int | None = None,
        monitor: Callable[[int], None] | None = None,
    ) -> list[str]:
        """Dump the tree rooted at `pid` (a PID as seen inside `namespace_pid`'s namespace when given).

        Returns the config lines used (they go into the manifest). Without `leave_running` the tree is
        killed by CRIU once the dump succeeded; on failure CRIU resumes it.
        """
        lines = options.dump_lines(namespace_pid is not None, net_ns_inode=net_ns_inode)
        if leave_running:
            lines.append("leave-running")
        self._run(
            "dump",
            lines,
            ["-t", str(pid)],
            images_dir,
            work_dir,
            namespace_pid=namespace_pid,
            join_cgroups=False,
            pass_fds=(),
            timeout_s=options.timeout_s,
            log_level=options.log_level,
            monitor=monitor,
        )
        return lines

    def restore(
        self,
        images_dir: Path,
        work_dir: Path,
        options: CriuOptions,
        *,
        namespace_pid: int | None = None,
        join_cgroups: bool = True,
        net_ns: Path | None = None,
        inherit: dict[int, str] | None = None,
        monitor: Callable[[int], None] | None = None,
    ) -> int:
        """Restore detached (`-d`); return the root's PID as CRIU saw it (from its pidfile).

        In namespace mode that PID is inside `namespace_pid`'s PID namespace: map it with
        `proctree.host_pid_in_ns`. The restored tree is re-parented (to init, or the pod's PID 1).
        `inherit` maps an open fd of ours to a file id of the image (`pipe:[123]`): CRIU hands that fd to
        the restored tree in place of the file, which is how a worker keeps writing to its (new) pod's logs.
        """
        pidfile = work_dir / "restore.pid"
        with contextlib.suppress(FileNotFoundError):
            pidfile.unlink()
        net_fd = os.open(net_ns, os.O_RDONLY | os.O_CLOEXEC) if (options.external_net_ns and net_ns) else None
        try:
            lines = options.restore_lines(namespace_pid is not None, net_ns_fd=net_fd)
            lines += [f"inherit-fd fd[{fd}]:{key}" for fd, key in sorted((inherit or {}).items())]
            self._run(
                "restore",
                lines,
                ["-d", "--pidfile", pidfile.name],
                images_dir,
                work_dir,
                namespace_pid=namespace_pid,
                join_cgroups=join_cgroups,
                pass_fds=((net_fd,) if net_fd is not None else ()) + tuple(sorted(inherit or {})),
                timeout_s=options.timeout_s,
                log_level=options.log_level,
                monitor=monitor,
            )
        finally:
            if net_fd is not None:
                os.close(net_fd)
        try:
            return int(pidfile.read_text().strip())
        except (OSError, ValueError) as exc:
            raise CriuError(
                f"criu restore succeeded but left no usable pidfile at {pidfile}: {exc}",
                log_tail=log_tail(work_dir / "restore.log"),
            ) from exc
