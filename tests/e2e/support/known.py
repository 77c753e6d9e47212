"""Known gaps of the other parts, as strict xfail marks: each names the missing piece, and a test
that starts passing fails (XPASS strict) so the mark is removed the day the piece lands."""

from __future__ import annotations

import pytest

#: found by this suite on the local cluster, 2026-11-30 (issue 5: agent + engine + workload SDK). Until
#: engine 122ec93 the restore itself failed (CRIU cgroup yard); since then CRIU restores the worker
#: (Restored=True RestoreSucceeded in ~0.5 s), but the worker is gone right after.
RESTORE_IN_A_POD = pytest.mark.xfail(
    strict=True,
    reason=(
        "a restored worker does not survive its restore (issue 5): the pod gets podsnap.io/Restored=True "
        "RestoreSucceeded in ~0.5 s, yet the restored process tree is gone at once (only pause and the "
        "placeholder remain, nothing listens on :8000, readiness is refused), so no restored pod ever serves"
    ),
)
