"""Running CRIU (>= 4): a config file per run, on the host or inside a target's namespaces, and its log.

Namespace mode (`namespace_pid`): CRIU runs inside the target's IPC, UTS, network, PID and mount
namespaces (like `nsenter -t PID -i -u -n -p -m`, see _nsenter), so it sees the target's mounts, PID
namespace and network exactly as the workload does: the dump needs no external mounts, and a restore
lands in the destination's PID namespace (re-parented to its PID 1) with the same namespace PIDs. It runs
there as root with every capability, among files the workload controls, so it must load and run nothing
of theirs: only a statically linked CRIU is accepted (no ELF interpreter, no libraries; `make setup`
builds one that also never executes a program or loads a plugin, see hack/build-criu.sh), with an
environment of PATH alone. The target is checked first and refused when its namespaces are not the
host's to control (_nsenter: a workload in a user namespace of its own can fake /proc). CRIU's binary,
the images and the work dir are NOT made visible in the target's mount namespace: they are opened here
as O_PATH descriptors; CRIU is exec'd through the binary's (no path of it is resolved in the container)
and pointed at the dirs as `/proc/self/fd/N`, resolved through the container's /proc, which the checks
keep genuine. No other descriptor of this process's filesystem crosses, and nothing is mounted, so the
workload can never see them. (Running a dynamic CRIU through this host's loader,
`ld.so --library-path ... criu`, was tried and fails at restore: /proc/self/exe is then ld.so, which
the restored process maps too, and the restorer's PR_SET_MM_MAP gets EBUSY.)

Logs: each run writes `<action>.log` into its work dir, which the caller chooses (and keeps when the
run fails). A failure raises CriuError whose message is one sentence (exit status, CRIU's first
error line, where the full log is); the log's tail travels in `CriuError.log_tail`, never in the text.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from podsnap.engine import _nsenter as nsenter
from podsnap.engine import _proctree as proctree
from podsnap.engine._criu_binary import CriuBinary, find_binary, read_version
from podsnap.engine._criu_config import CriuOptions, config_text
from podsnap.engine.errors import CriuError

LOG_TAIL_LINES = 30
#: what of CRIU's stdout/stderr or an error line reaches a message
_CAUSE_CHARS = 300


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


# CRIU logs these on runs in a container while it probes the kernel (kerndat: no /dev/null, no tun, the
# helper programs podsnap's CRIU refuses to run); they never say why a run failed
_HARMLESS = ("RLIMIT_NOFILE", "criu/netfilter.c", "criu/kerndat.c", "criu/tun.c", 'execvp("')
#: hack/criu-confine.c's refusals: a workload's path CRIU did not follow; that is the cause of the failure
CONFINE_MARK = "(podsnap confine)"


def first_error(path: Path) -> str | None:
    """The cause of a failed run in CRIU's log at `path`: a refusal of the path confinement, else CRIU's first
    error line (later ones are consequences)."""
    with contextlib.suppress(OSError):
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if "Error" in ln]
        confined = [ln for ln in lines if CONFINE_MARK in ln]
        for line in confined or [ln for ln in lines if not any(h in ln for h in _HARMLESS)]:
            return line.strip()[:_CAUSE_CHARS]
    return None


def _copy_logs(action: str, logs: list[Path], log_dir: Path) -> Path | None:
    """Copy `logs` into a fresh dir under `log_dir` (created exclusively; no symlink followed at the dir or
    the files): the copy where a failed run's log outlives this process. None when it cannot be made."""
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        top = os.open(log_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        name = f"podsnap-{action}-{os.urandom(6).hex()}"
        os.mkdir(name, 0o755, dir_fd=top)  # exclusive: a name planted there fails it
        sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=top)
        try:
            for log in logs:
                fd = os.open(log.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                             dir_fd=sub)  # fmt: skip
                with os.fdopen(fd, "wb") as out, log.open("rb") as src:
                    shutil.copyfileobj(src, out)
        finally:
            os.close(sub)
    except OSError:
        return None
    finally:
        os.close(top)
    return log_dir / name


def _point_at(exc: BaseException, private: Path, kept: Path) -> None:
    """Make an error that names a log in the private dir `private` name its copy in `kept` instead."""
    log_path = getattr(exc, "log_path", None)
    if isinstance(log_path, Path) and log_path.is_relative_to(private):
        exc.log_path = kept / log_path.relative_to(private)  # type: ignore[attr-defined]
    if exc.args and isinstance(exc.args[0], str):
        exc.args = (exc.args[0].replace(f"{private}/", f"{kept}/"), *exc.args[1:])


@contextlib.contextmanager
def work_dir(action: str, *, explicit: Path | None = None, log_dir: Path | None = None) -> Iterator[Path]:
    """CRIU's work dir for one run (config, log, pidfile). CRIU runs as root on the config it finds there,
    so the dir is private and node-local: `explicit` as given (kept; the caller's own), else a fresh 0700
    dir in the system temp dir, never under `log_dir` (the agent's is on the artifact volume, which
    others may write). Removed when the block succeeds. When it raises after CRIU wrote its log, the logs
    are COPIED into a fresh dir under `log_dir` and the error names the copy (its `log_path` and message);
    without `log_dir`, or when the copy fails, the private dir itself is kept and named."""
    if explicit is not None:
        explicit.mkdir(parents=True, exist_ok=True)
        yield explicit
        return
    path = Path(tempfile.mkdtemp(prefix=f"podsnap-{action}-"))
    try:
        yield path
    except BaseException as exc:
        logs = sorted(path.glob("*.log"))
        if not logs:  # CRIU never got to write its log: nothing worth keeping
            shutil.rmtree(path, ignore_errors=True)
        elif log_dir is not None:
            kept = _copy_logs(action, logs, log_dir)
            if kept is not None:
                _point_at(exc, path, kept)
                shutil.rmtree(path, ignore_errors=True)
        raise
    shutil.rmtree(path, ignore_errors=True)


@dataclass(frozen=True)
class _View:
    """How the CRIU process sees its binary, images and work dir, and the fds it must inherit."""

    exe: str
    images: str
    work: str
    fds: tuple[int, ...] = ()
    #: namespace mode: the O_PATH fd CRIU is exec'd through, and the checked namespaces it runs in
    exe_fd: int | None = None
    target: nsenter.Target | None = None


@contextlib.contextmanager
def _view(
    binary: CriuBinary, images_dir: Path, work_dir: Path, namespace_pid: int | None, namespace_start: int | None = None
) -> Iterator[_View]:
    """On the host: plain paths. In namespace mode: the checked namespaces of `namespace_pid` (CriuError
    when refused), and O_PATH fds of the static binary file, the images dir and the work dir, the dirs
    inherited and seen as `/proc/self/fd/N` (nothing is mounted where the workload could see them);
    closed afterwards."""
    if namespace_pid is None:
        yield _View(str(binary.exe), str(images_dir), str(work_dir))
        return
    fds: list[int] = []
    try:
        with nsenter.target(namespace_pid, namespace_start) as target:
            fds.append(os.open(binary.exe, os.O_PATH | os.O_CLOEXEC))
            for d in (images_dir, work_dir):
                fds.append(os.open(d, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
            yield _View(
                exe="criu",
                images=f"/proc/self/fd/{fds[1]}",
                work=f"/proc/self/fd/{fds[2]}",
                fds=tuple(fds[1:]),
                exe_fd=fds[0],
                target=target,
            )
    except nsenter.Refused as exc:
        raise CriuError(f"refused to run criu in the namespaces of pid {namespace_pid}: {exc}") from exc
    finally:
        for fd in fds:
            os.close(fd)


def _require_static(binary: CriuBinary) -> None:
    if not binary.is_static:
        raise CriuError(
            f"{binary.exe} is not a statically linked CRIU: inside a container the kernel would load it with "
            "the container's own ELF interpreter and libc, as root. Namespace mode needs a static CRIU "
            "(`make setup` builds one; hack/build-criu.sh)"
        )


def _namespace_env() -> dict[str, str]:
    """CRIU's whole environment in namespace mode: PATH alone (the CRIU it accepts executes nothing). Nothing
    else of ours (LD_*, CRIU_CONFIG_FILE, CRIU_LIBS_DIR, XDG_RUNTIME_DIR...) may steer CRIU in a container."""
    return {"PATH": os.environ.get("PATH", os.defpath)}


def _join_cgroups_of(pid: int, cgroup_root: Path) -> tuple[Callable[[], None], list[int]]:
    """A preexec function moving the child into every cgroup of `pid` (v1 and v2), and the fds it writes to.

    The cgroup.procs files are opened here, so a cgroup that cannot be joined fails the call with its
    name instead of leaving the restored tree in the caller's cgroups (e.g. the agent's, whose restart
    would then kill it); the child only writes its pid. The caller closes the fds after the fork."""
    try:
        targets = proctree.cgroup_procs_files(pid, cgroup_root)
    except OSError as exc:
        raise CriuError(f"cannot join the cgroups of pid {pid}: {exc}") from exc
    fds: list[int] = []
    try:
        for procs in targets:
            fds.append(os.open(procs, os.O_WRONLY | os.O_CLOEXEC))
    except OSError as exc:
        for fd in fds:
            os.close(fd)
        raise CriuError(f"cannot join the cgroups of pid {pid}: {exc}") from exc

    def join() -> None:
        me = str(os.getpid()).encode()
        for fd in fds:
            os.write(fd, me)  # an error here fails the Popen: no CRIU outside the destination's cgroups

    return join, fds


def failure(action: str, returncode: int, output: str, log: Path, namespace_pid: int | None) -> CriuError:
    """The CriuError of a failed run: exit status, CRIU's first error line, where the full log is."""
    where = f" (namespaces of pid {namespace_pid})" if namespace_pid else ""
    said = [ln.strip() for ln in output.splitlines() if ln.strip()]
    cause = first_error(log) or (said[-1][:_CAUSE_CHARS] if said else "no error line in its log")
    kept = log.is_file()
    return CriuError(
        f"criu {action} exited with {returncode}{where}: {cause} "
        + (f"(full log: {log})" if kept else "(it wrote no log)"),
        log_tail=log_tail(log) if kept else "\n".join(said[-LOG_TAIL_LINES:]),
        log_path=log if kept else None,
        returncode=returncode,
    )


def _wait(
    proc: subprocess.Popen[bytes],
    action: str,
    timeout_s: float,
    monitor: Callable[[int], None] | None,
    log: Path,
) -> str:
    chunks: list[bytes] = []
    assert proc.stdout is not None
    stdout = proc.stdout
    reader = threading.Thread(target=lambda: chunks.append(stdout.read()), daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout_s
    try:
        while proc.poll() is None:
            if time.monotonic() > deadline:
                raise CriuError(
                    f"criu {action} did not finish within {timeout_s:.0f} s: killed it (full log: {log})",
                    log_tail=log_tail(log),
                    log_path=log,
                )
            if monitor is not None:
                monitor(proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.25)
    except BaseException:
        # a timeout, or the caller's monitor/progress raised: CRIU must not outlive this call
        proc.kill()
        proc.wait()
        raise
    reader.join(timeout=5)
    return b"".join(chunks).decode(errors="replace")


@dataclass(frozen=True)
class _Call:
    """One CRIU run: the action, its config lines and arguments, where, and how it is watched."""

    action: str
    lines: list[str]
    args: list[str]
    images_dir: Path
    work_dir: Path
    options: CriuOptions
    namespace_pid: int | None
    #: in namespace mode, join the target's cgroups before exec (a restore lands in the pod's cgroups)
    join_cgroups: bool = False
    #: the host's cgroup filesystem as mounted here, through which those cgroups are joined
    cgroup_root: Path = Path("/sys/fs/cgroup")
    #: our fds CRIU inherits (inherit-fd targets, a net ns)
    pass_fds: tuple[int, ...] = ()
    monitor: Callable[[int], None] | None = None
    #: namespace_pid's start time as the caller found it (PID reuse is refused); None: not checked
    namespace_start: int | None = None


def _invoke(binary: CriuBinary, call: _Call) -> None:
    """Write the config, run CRIU (on the host, or in the target's checked namespaces, see _nsenter), wait for
    it (killing it on a timeout or when `monitor` raises), and raise CriuError when it failed."""
    work, action, ns = call.work_dir, call.action, call.namespace_pid
    work.mkdir(parents=True, exist_ok=True)
    conf = work / f"{action}.conf"
    conf.write_text(config_text(call.lines))
    log = work / f"{action}.log"
    with contextlib.suppress(FileNotFoundError):
        log.unlink()
    with _view(binary, call.images_dir, work, ns, call.namespace_start) as v:
        cmd = [v.exe, action, "--no-default-config", "--config", f"{v.work}/{conf.name}"]
        cmd += ["-D", v.images, "-W", v.work, "-o", log.name, f"-v{int(call.options.log_level)}", *call.args]
        preexec, cgroup_fds = (
            _join_cgroups_of(ns, call.cgroup_root) if (ns is not None and call.join_cgroups) else (None, [])
        )
        env = binary.env() if ns is None else _namespace_env()
        if v.target is not None and v.exe_fd is not None:
            # the child execs CRIU itself, through its fd, and never returns to Popen's exec of `cmd`
            preexec = nsenter.exec_in(
                v.target, v.exe_fd, cmd, env, keep_fds=(*v.fds, *call.pass_fds), dirs=v.fds, before=preexec
            )
        try:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                pass_fds=(*v.fds, *call.pass_fds),
                preexec_fn=preexec,  # noqa: PLW1509 - joins cgroups; in namespace mode enters them and execs
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise CriuError(f"cannot start criu {action}: {exc}") from exc
        finally:
            for fd in cgroup_fds:
                os.close(fd)
        output = _wait(proc, action, call.options.timeout_s, call.monitor, log)
    if proc.returncode != 0:
        raise failure(action, proc.returncode, output, log, ns)


class Criu:
    """One CRIU installation. Every failure raises CriuError (short message; log tail and path attached)."""

    def __init__(self, binary: CriuBinary | None = None) -> None:
        self.binary = binary or find_binary()
        self._version: str | None = None

    def version(self) -> str:
        """CRIU's version ("4.2.1"); raise CriuError when older than 4 or not runnable."""
        if self._version is None:
            self._version = read_version(self.binary)
        return self._version

    def check(self) -> tuple[bool, str]:
        """`criu check`: (passed, its output)."""
        out = subprocess.run(
            [str(self.binary.exe), "check"],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
            env=self.binary.env(),
        )
        text = (out.stdout + out.stderr).strip()
        return out.returncode == 0 and "Looks good" in text, text

    def _run(self, call: _Call) -> None:
        if call.namespace_pid is not None:
            _require_static(self.binary)
        self.version()
        _invoke(self.binary, call)

    def dump(
        self,
        pid: int,
        images_dir: Path,
        work_dir: Path,
        options: CriuOptions,
        *,
        namespace_pid: int | None = None,
        namespace_start: int | None = None,
        leave_running: bool = False,
        net_ns_inode: int | None = None,
        monitor: Callable[[int], None] | None = None,
    ) -> list[str]:
        """Dump the tree rooted at `pid` (a PID as seen inside `namespace_pid`'s namespace when given).

        Returns the config lines used (they go into the manifest). Without `leave_running` the tree is
        killed by CRIU once the dump succeeded; on failure CRIU resumes it.
        """
        lines = options.dump_lines(namespace_pid is not None, net_ns_inode=net_ns_inode, leave_running=leave_running)
        args = ["-t", str(pid)]
        call = _Call("dump", lines, args, images_dir, work_dir, options, namespace_pid, monitor=monitor)
        self._run(dataclasses.replace(call, namespace_start=namespace_start))
        return lines

    def restore(
        self,
        images_dir: Path,
        work_dir: Path,
        options: CriuOptions,
        *,
        namespace_pid: int | None = None,
        namespace_start: int | None = None,
        join_cgroups: bool = True,
        cgroup_root: Path = Path("/sys/fs/cgroup"),
        net_ns: Path | None = None,
        inherit: Mapping[int, str] | None = None,
        leave_stopped: bool = False,
        monitor: Callable[[int], None] | None = None,
    ) -> int:
        """Restore detached (`-d`); return the root's PID as CRIU saw it (from its pidfile).

        In namespace mode that PID is inside `namespace_pid`'s PID namespace: map it with
        `proctree.host_pid_in_ns`. The restored tree is re-parented (to init, or the pod's PID 1).
        `inherit` maps an open fd of ours to a file id of the image (`pipe:[123]`): CRIU hands that fd to
        the restored tree in place of the file, which is how a worker keeps writing to its (new) pod's logs.
        `leave_stopped`: every restored task is left stopped (SIGSTOP), for its caller to fill and resume.
        """
        pidfile = work_dir / "restore.pid"
        with contextlib.suppress(FileNotFoundError):
            pidfile.unlink()
        net_fd = os.open(net_ns, os.O_RDONLY | os.O_CLOEXEC) if (options.external_net_ns and net_ns) else None
        try:
            lines = options.restore_lines(
                namespace_pid is not None, net_ns_fd=net_fd, inherit=inherit, leave_stopped=leave_stopped
            )
            args = ["-d", "--pidfile", pidfile.name]
            fds = ((net_fd,) if net_fd is not None else ()) + tuple(sorted(inherit or {}))
            call = _Call(
                "restore", lines, args, images_dir, work_dir, options, namespace_pid, join_cgroups, cgroup_root,
                fds, monitor, namespace_start,
            )  # fmt: skip
            self._run(call)
        finally:
            if net_fd is not None:
                os.close(net_fd)
        try:
            return int(pidfile.read_text().strip())
        except (OSError, ValueError) as exc:
            log = work_dir / "restore.log"
            raise CriuError(
                f"criu restore succeeded but left no usable pidfile at {pidfile}: {exc} (full log: {log})",
                log_tail=log_tail(log),
                log_path=log,
            ) from exc
