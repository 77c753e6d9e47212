"""Which /proc CRIU may be run under: a pod's as container runtimes make it passes, anything a workload
could have put there instead is named (security review 2, finding 1). The engine tests mount real fake
/procs; these cover the kinds of pods this machine cannot start (runc's masks, the NVIDIA toolkit)."""

from __future__ import annotations

from pathlib import Path

import pytest

from podsnap.engine._nsenter import proc_mount_problem

ROOT = "1200 1100 0:60 / / rw,relatime master:1 - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w"
PROC = "1201 1200 0:61 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw"
#: what runc (containerd, CRI-O) leaves under /proc of an ordinary container: read-only binds of procfs
#: over itself, empty read-only tmpfs over directories, /dev/null over files
RUNC = [
    ROOT,
    PROC,
    "1202 1200 0:62 / /dev rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755",
    *(
        f"12{i:02d} 1201 0:61 /{n} /proc/{n} ro,nosuid,nodev,noexec,relatime - proc proc rw"
        for i, n in enumerate(("bus", "fs", "irq", "sys", "sysrq-trigger"), start=10)
    ),
    "1220 1201 0:63 / /proc/acpi ro,relatime - tmpfs tmpfs ro",
    "1221 1201 0:62 /null /proc/kcore rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755",
    "1222 1201 0:62 /null /proc/keys rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755",
    "1223 1201 5:3 /null /proc/timer_list rw,nosuid - devtmpfs udev rw,size=4k",
    "1224 1201 0:64 / /proc/scsi ro,relatime - tmpfs tmpfs ro",
]
NVIDIA = [
    "1230 1201 0:70 / /proc/driver/nvidia rw,nosuid,nodev,noexec,relatime - tmpfs tmpfs rw,mode=555",
    "1231 1230 0:5 /driver/nvidia/params /proc/driver/nvidia/params ro,nosuid,nodev,noexec - proc proc rw",
    "1232 1230 0:5 /driver/nvidia/gpus/0000:18:00.0 /proc/driver/nvidia/gpus/0000:18:00.0 ro - proc proc rw",
]


def test_a_containers_proc_as_runtimes_and_the_nvidia_toolkit_make_it_passes() -> None:
    assert proc_mount_problem("\n".join(RUNC)) is None
    assert proc_mount_problem("\n".join(RUNC + NVIDIA)) is None


def test_this_machines_own_mounts_pass() -> None:
    assert proc_mount_problem(Path("/proc/self/mountinfo").read_text()) is None


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("1300 1201 0:80 / /proc rw - tmpfs fake rw", "/proc is a tmpfs mount, not procfs"),
        ("1300 1201 0:80 / /proc/self/fd rw - tmpfs fake rw", "a tmpfs mount at /proc/self/fd"),
        ("1300 1201 0:80 / /proc/thread-self rw - tmpfs fake rw", "a tmpfs mount at /proc/thread-self"),
        ("1300 1201 8:1 /tenant /proc/1 rw - ext4 /dev/sda1 rw", "a ext4 mount at /proc/1"),
        ("1300 1201 0:80 / /proc/sys rw - tmpfs fake rw", "a tmpfs mount at /proc/sys"),
        ("1300 1201 0:80 / /proc/kcore\\040x rw - tmpfs fake rw", "a tmpfs mount at /proc/kcore x"),
        ("1300 1230 0:80 / /proc/driver/nvidia/x rw - overlay o rw", "a overlay mount at /proc/driver/nvidia/x"),
    ],
)
def test_anything_a_workload_could_mount_there_is_named(line: str, problem: str) -> None:
    found = proc_mount_problem("\n".join([*RUNC, *NVIDIA, line]))
    assert found is not None and problem in found


def test_no_proc_at_all_is_refused() -> None:
    assert proc_mount_problem(ROOT) == "no procfs is mounted at /proc"
