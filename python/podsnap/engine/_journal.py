"""A capture's journal: what the capture has done to its source so far, kept durably on disk, so that
whoever finds the record after the capturing process died (an agent killed mid-capture) can give the
source back what the capture took from it.

The capture writes the record before it touches the source (before the CUDA lock), rewrites it as each
step begins, and removes it when it ends, published or rolled back. Each write is atomic (a temporary
file fsynced, renamed over the record, the directory fsynced): a reader sees the old step or the new one.

A record names its processes by PID *and* start time (field 22 of /proc/PID/stat, clock ticks since
boot) *and* the boot it was written in: after the source exited, its PID may belong to another process,
and `recover` must never touch that one.

Recovery (`recover`), for the root if it still is that exact process:
- each CUDA process of the record gets its CUDA state back: the driver's own state decides (CHECKPOINTED:
  Restore then Unlock; LOCKED: Unlock; RUNNING: nothing), and where the driver cannot say, the step
  the record reached does;
- every process of the tree that is stopped (state T) is continued: CRIU seizes the tree with ptrace, and
  a tracer that dies in the middle can leave its tracees in a group stop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from podsnap.engine import _proctree as proctree
from podsnap.engine._artifact import fsync_path
from podsnap.engine._cuda import CudaCheckpointer, default_checkpointer
from podsnap.engine.errors import CudaError

VERSION = 1
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")

#: the steps a capture records, in order; each is written just before it begins
STEP_INSPECTED = "inspected"  # nothing done to the source yet
STEP_CUDA_LOCK = "cuda_lock"
STEP_CUDA_CHECKPOINT = "cuda_checkpoint"
STEP_CRIU_DUMP = "criu_dump"
#: the dump succeeded: without leave_running CRIU ended the source, with it the CUDA state is given back now
STEP_DUMPED = "dumped"
STEPS = (STEP_INSPECTED, STEP_CUDA_LOCK, STEP_CUDA_CHECKPOINT, STEP_CRIU_DUMP, STEP_DUMPED)


def boot_id() -> str:
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


def start_time(pid: int, proc: Path = proctree.PROC) -> int | None:
    """When `pid` started (clock ticks after boot, /proc/PID/stat field 22); None when it is gone."""
    try:
        raw = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # the comm field (2) is in parentheses and may hold spaces or ")": fields after the last ")" are fixed
    rest = raw[raw.rfind(")") + 2 :].split()
    try:
        return int(rest[19])  # rest[0] is field 3 (state), so field 22 is rest[19]
    except (IndexError, ValueError):
        return None


@dataclass(frozen=True)
class Proc:
    """One process as the record names it: a PID and when it started."""

    pid: int
    start: int

    def same(self) -> bool:
        """Whether that very process still runs (not a zombie, not another process under its PID)."""
        return proctree.is_alive(self.pid) and start_time(self.pid) == self.start


@dataclass(frozen=True)
class Record:
    root: Proc
    tree: tuple[Proc, ...]
    cuda: tuple[Proc, ...]
    step: str
    boot: str
    leave_running: bool = False
    #: pids already stopped when the capture began: their stop is not the capture's to undo
    stopped: tuple[int, ...] = ()
    #: free-form, for whoever recovers the record (the agent: the content's name)
    note: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": VERSION,
                "bootId": self.boot,
                "root": [self.root.pid, self.root.start],
                "tree": [[p.pid, p.start] for p in self.tree],
                "cuda": [[p.pid, p.start] for p in self.cuda],
                "step": self.step,
                "leaveRunning": self.leave_running,
                "stopped": list(self.stopped),
                "note": dict(self.note),
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> Record:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise ValueError(f"not a version {VERSION} capture journal record")
        if not isinstance(data.get("note") or {}, dict):
            raise ValueError("capture journal record: 'note' is not an object")

        def proc(item: Any) -> Proc:
            pid, start = item
            return Proc(int(pid), int(start))

        return cls(
            root=proc(data["root"]),
            tree=tuple(proc(p) for p in data.get("tree") or ()),
            cuda=tuple(proc(p) for p in data.get("cuda") or ()),
            step=str(data["step"]),
            boot=str(data.get("bootId") or ""),
            leave_running=bool(data.get("leaveRunning")),
            stopped=tuple(int(p) for p in data.get("stopped") or ()),
            note={str(k): str(v) for k, v in (data.get("note") or {}).items()},
        )


def procs(pids: Iterable[int]) -> tuple[Proc, ...]:
    """`pids` with their start times (those already gone are left out)."""
    out = []
    for pid in pids:
        start = start_time(pid)
        if start is not None:
            out.append(Proc(pid, start))
    return tuple(out)


class Journal:
    """The record of one capture at `path` (None: a capture that keeps none)."""

    def __init__(self, path: Path | None, note: Mapping[str, str] | None = None) -> None:
        self.path = path
        self.note = dict(note or {})
        self.record: Record | None = None

    def begin(self, root: int, tree: Iterable[int], cuda: Iterable[int], *, leave_running: bool) -> None:
        """Write the first record (step `inspected`): before anything touches the source."""
        if self.path is None:
            return
        me = procs([root])
        if not me:
            raise ProcessLookupError(f"no process with pid {root}")
        members = procs(tree)
        self.record = Record(
            root=me[0],
            tree=members,
            cuda=procs(cuda),
            step=STEP_INSPECTED,
            boot=boot_id(),
            leave_running=leave_running,
            stopped=tuple(p.pid for p in members if proctree.state(p.pid) == "T"),
            note=self.note,
        )
        self._write(self.record)

    def step(self, step: str) -> None:
        """Record that `step` begins (written and synced before the step touches anything)."""
        if self.path is None or self.record is None:
            return
        self.record = dataclasses.replace(self.record, step=step)
        self._write(self.record)

    def end(self) -> None:
        """The capture ended (published or rolled back): nothing left to recover."""
        if self.path is None:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
            fsync_path(self.path.parent, directory=True)
        self.record = None

    def _write(self, record: Record) -> None:
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.parent / f".{self.path.name}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            with tmp.open("w") as f:
                f.write(record.to_json())
                f.flush()
                os.fsync(f.fileno())
            tmp.replace(self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        fsync_path(self.path.parent, directory=True)


def read(path: Path) -> Record:
    """The record at `path`; ValueError when it is not one (a torn write cannot happen: see `Journal`)."""
    try:
        return Record.from_json(path.read_text())
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a capture journal record ({exc})") from exc


@dataclass(frozen=True)
class Recovery:
    """What `recover` found and did. `source_alive`: the recorded root still is that process."""

    record: Record
    source_alive: bool
    #: what was done, in order (e.g. "cuCheckpointProcessRestore pid 12", "SIGCONT pid 13")
    actions: tuple[str, ...] = ()
    #: what could not be undone (driver errors): the source may stay locked, and its owner must know
    problems: tuple[str, ...] = ()

    def summary(self) -> str:
        r = self.record
        if not self.source_alive:
            return f"the source (pid {r.root.pid}) is gone; nothing to give back (capture was at step {r.step})"
        done = "; ".join(self.actions) or "nothing needed"
        text = f"the source (pid {r.root.pid}) was at capture step {r.step}; recovered: {done}"
        if self.problems:
            text += f"; NOT recovered: {'; '.join(self.problems)}"
        return text


def _at_least(step: str, than: str) -> bool:
    try:
        return STEPS.index(step) >= STEPS.index(than)
    except ValueError:
        return True  # an unknown step: assume the most was done, the driver's state decides first


def _give_back_cuda(record: Record, cuda: CudaCheckpointer, actions: list[str], problems: list[str]) -> None:
    for proc in record.cuda:
        if not proc.same():
            continue
        try:
            state = cuda.state(proc.pid)
        except CudaError:
            # the driver cannot say: the step says what the capture may have done
            state = "CHECKPOINTED" if _at_least(record.step, STEP_CUDA_CHECKPOINT) else "LOCKED"
        calls: list[tuple[str, Any]] = []
        if state == "CHECKPOINTED":
            calls.append(("cuCheckpointProcessRestore", cuda.restore))
        if state in ("CHECKPOINTED", "LOCKED"):
            calls.append(("cuCheckpointProcessUnlock", cuda.unlock))
        for name, call in calls:
            try:
                call(proc.pid)
                actions.append(f"{name} pid {proc.pid}")
            except CudaError as exc:
                problems.append(str(exc))
                break  # an unlock after a failed restore would run a process without its GPU memory


def _continue_stopped(record: Record, actions: list[str], problems: list[str]) -> None:
    if not _at_least(record.step, STEP_CRIU_DUMP):
        return  # CRIU never seized the tree: a stop is not the capture's
    candidates = (record.root, *record.tree)
    stopped = [p.pid for p in candidates if p.pid not in record.stopped and p.same() and proctree.state(p.pid) == "T"]
    for pid in dict.fromkeys(stopped):
        try:
            os.kill(pid, signal.SIGCONT)
            actions.append(f"SIGCONT pid {pid}")
        except OSError as exc:
            problems.append(f"SIGCONT pid {pid}: {exc}")


def recover(record: Record, cuda: CudaCheckpointer | None = None) -> Recovery:
    """Give the source of a capture whose process died what that capture took (see the module doc).
    `cuda`: the driver (default: the host's, made only when the record names CUDA processes). Never
    raises for the driver: what failed is in `problems`."""
    alive = record.boot == boot_id() and record.root.same()
    if not alive:
        return Recovery(record, source_alive=False)
    actions: list[str] = []
    problems: list[str] = []
    # the tree runs again first, as after a failed dump: the driver's restore works in the target's own
    # threads, and a process whose CUDA state is still locked only blocks in CUDA until it is unlocked
    _continue_stopped(record, actions, problems)
    if record.cuda and _at_least(record.step, STEP_CUDA_LOCK):
        _give_back_cuda(record, cuda or default_checkpointer(), actions, problems)
    return Recovery(record, source_alive=True, actions=tuple(actions), problems=tuple(problems))
