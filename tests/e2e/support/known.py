"""Known gaps of the other parts, as strict xfail marks: each names the missing piece, and a test
that starts passing fails (XPASS strict) so the mark is removed the day the piece lands."""

from __future__ import annotations

import pytest

#: found by this suite on the local cluster, 2026-11-30 (issue 5: agent + engine)
RESTORE_IN_A_POD = pytest.mark.xfail(
    strict=True,
    reason=(
        "restore into a real pod fails: the agent's CRIU restore exits 1 at 'cg: Preparing cgroups yard "
        "(cgroups restore mode 0x4)' with 'Unable to mount tmpfs in .criu.cgyard.*: Invalid argument' "
        "(the dump carries cgroup info, so restore makes a cgroup yard in its work dir, which is in the "
        "agent's mount namespace, not the pod's): every pod shaped for restore ends RestoreFailed"
    ),
)
