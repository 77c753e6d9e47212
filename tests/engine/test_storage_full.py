"""The volume filling up after CRIU's dump, while podsnap writes its own files (the bulk memory cut out of
CRIU's images, the manifest), on a real small filesystem (a tmpfs with a size limit) with real CRIU: the
capture rolls back, nothing of it is visible, and the error says the volume was full (`no_space`, which
the agent reports as StorageFull). With `leave_running` the source serves on."""

from __future__ import annotations

from pathlib import Path

import pytest

from podsnap.engine import CaptureError, CaptureOptions, Criu, Progress, capture
from tests.support.processes import Worker, http_get
from tests.support.small_fs import fill, small_tmpfs

pytestmark = pytest.mark.slow


def test_a_volume_filling_while_podsnap_writes_its_files_rolls_the_capture_back(criu: Criu, tmp_path: Path) -> None:
    worker = Worker(tmp_path / "worker", bulk_mib=32)
    try:
        with small_tmpfs(tmp_path / "volume", "256m") as volume:
            phases: list[str] = []

            def progress(p: Progress) -> None:
                if p.phase == "cut" and not p.finished and not phases:
                    phases.append(p.phase)
                    fill(volume)  # the dump fit; now another writer takes the rest of the volume

            out = volume / "ns" / "snap"
            options = CaptureOptions(leave_running=True, journal=volume / ".journal" / "c-1.json")
            with pytest.raises(CaptureError) as failed:
                capture(worker.pid, out, options, criu=criu, progress=progress)
            assert phases == ["cut"], "the dump itself fit"
            assert failed.value.no_space, failed.value
            assert failed.value.phase in ("cut", "publish"), failed.value.phase
            assert "the artifact volume is full" in str(failed.value)
            assert sorted(p.name for p in out.parent.iterdir()) == [], "no artifact, no staging dir left"
            assert list((volume / ".journal").iterdir()) == []
        assert http_get(worker.port)["init_id"] == worker.init_id, "the source serves on"
    finally:
        worker.kill()
