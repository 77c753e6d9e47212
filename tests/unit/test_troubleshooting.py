"""docs/troubleshooting.md cannot fall behind the code: every condition reason podsnap sets, every Event
reason of a failure, and every reason `podsnap status` gives for a cold or waiting pod has its entry."""

from __future__ import annotations

import re
from pathlib import Path

from podsnap import contract
from podsnap.cli import status_doc
from podsnap.operator import on_spec_change, orphans, stale_placement

DOC = Path(__file__).resolve().parents[2] / "docs" / "troubleshooting.md"


def reasons() -> set[str]:
    found = {v for k, v in vars(contract).items() if k.startswith("REASON_") and isinstance(v, str)}
    found |= {on_spec_change.REASON_SPEC_IMMUTABLE, orphans.REASON_ARTIFACT_LEFT, orphans.REASON_HANDED_OVER}
    found |= {stale_placement.REASON_PLACEMENT_LABELS_REMOVED}
    found |= {status_doc.COLD_NO_POLICY, status_doc.COLD_CHECKPOINT_NOT_READY, status_doc.COLD_NOT_SHAPED}
    found |= {status_doc.WAITING_FOR_AGENT, status_doc.HELD_WAIT}
    return found


def test_every_reason_has_an_entry() -> None:
    named = set(re.findall(r"`([A-Z][A-Za-z]+)`", DOC.read_text()))
    assert len(reasons()) >= 25, "the reason scan found too little: fix the test"
    missing = sorted(reasons() - named)
    assert not missing, f"docs/troubleshooting.md has no entry for {missing}: say what each means and what to do"
