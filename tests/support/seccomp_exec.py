"""Run a command under a seccomp profile the way runc loads a Localhost profile: `python -m
tests.support.seccomp_exec PROFILE.json CMD [ARG...]`.

containerd reads the profile file as the OCI `LinuxSeccomp` struct and runc hands it to libseccomp:
the default action; every listed architecture added to the filter; each rule's names resolved for this
machine, a name libseccomp does not know skipped; a rule whose action is the default skipped; a rule's
argument conditions ANDed. This does the same through libseccomp's C API (ctypes), then execs CMD, so
the kernel filters a real process with exactly the profile's data. No Kubernetes, no runtime needed.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from pathlib import Path
from typing import Any

ACT_ALLOW = 0x7FFF0000
ACT_ERRNO_BASE = 0x00050000
#: libseccomp's enum scmp_compare
OPS = {
    "SCMP_CMP_NE": 1,
    "SCMP_CMP_LT": 2,
    "SCMP_CMP_LE": 3,
    "SCMP_CMP_EQ": 4,
    "SCMP_CMP_GE": 5,
    "SCMP_CMP_GT": 6,
    "SCMP_CMP_MASKED_EQ": 7,
}
#: SCMP_ARCH_* of the OCI spec -> libseccomp's arch names
ARCHES = {"SCMP_ARCH_X86_64": "x86_64", "SCMP_ARCH_X86": "x86", "SCMP_ARCH_X32": "x32",
          "SCMP_ARCH_AARCH64": "aarch64", "SCMP_ARCH_ARM": "arm"}  # fmt: skip


class ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def action(name: str, errno: int | None, default_errno: int = 1) -> int:
    if name == "SCMP_ACT_ALLOW":
        return ACT_ALLOW
    if name == "SCMP_ACT_ERRNO":
        return ACT_ERRNO_BASE | ((default_errno if errno is None else errno) & 0xFFFF)
    raise ValueError(f"action {name!r} is not one this loader knows")


def load(profile: dict[str, Any]) -> None:
    lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_arch_resolve_name.restype = ctypes.c_uint32
    ctx = ctypes.c_void_p(
        lib.seccomp_init(ctypes.c_uint32(action(profile["defaultAction"], profile.get("defaultErrnoRet"))))
    )
    if not ctx:
        raise OSError("seccomp_init failed")
    for arch in profile.get("architectures") or []:
        token = lib.seccomp_arch_resolve_name(ARCHES[arch].encode())
        rc = lib.seccomp_arch_add(ctx, ctypes.c_uint32(token))
        if rc not in (0, -17):  # -EEXIST: the native arch is in every filter already
            raise OSError(-rc, f"seccomp_arch_add({arch})")
    default = action(profile["defaultAction"], profile.get("defaultErrnoRet"))
    for rule in profile["syscalls"]:
        act = action(rule["action"], rule.get("errnoRet"))
        if act == default:
            continue
        args = rule.get("args") or []
        if len({a["index"] for a in args}) != len(args):
            raise ValueError(f"rule {rule} compares one argument twice: runc splits those, this loader does not")
        cmps = (ArgCmp * max(len(args), 1))(
            *(ArgCmp(a["index"], OPS[a["op"]], a["value"], a.get("valueTwo", 0)) for a in args)
        )
        for name in rule["names"]:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr == -1:  # __NR_SCMP_ERROR: not a syscall libseccomp knows
                continue
            rc = lib.seccomp_rule_add_array(ctx, ctypes.c_uint32(act), nr, len(args), cmps)
            if rc != 0:
                raise OSError(-rc, f"seccomp_rule_add({name}, {rule['action']}, {args})")
    rc = lib.seccomp_load(ctx)
    if rc != 0:
        raise OSError(-rc, "seccomp_load")


def main() -> None:
    path, *cmd = sys.argv[1:]
    load(json.loads(Path(path).read_text()))
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main()
