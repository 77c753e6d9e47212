"""A restore from the agent's node-local artifact cache against one from the artifact volume, real CRIU,
on any Linux host (no GPU).

A worker holds SIZE GiB of random bytes in one anonymous mapping (what a CUDA checkpoint leaves in a
worker's host memory). It is captured once onto the "volume" directory. Then, ROUNDS times:
- `volume`: its files dropped from the page cache (posix_fadvise DONTNEED), restored from the volume as
  the agent does today (every digest checked);
- `fill`: the cache fill the agent runs (volume dropped from the page cache again): copy, full
  verification, seal, rename;
- `cache`: restored from the cache entry the fill made, as the agent does on a hit (the engine's
  `verified_digests` when it has it: nothing hashed again);
- `cache-hashed`: the same entry restored with every digest checked (what a hit costs on an engine
  without `verified_digests`).
Each restore is checked bit-exact (the region's sha256 read back through /proc). Prints the median of
each and the fill's copy and verification rates (the inputs of the wait-or-read-the-volume rule of
agent/cached_executor.py); writes JSON to $OUT/cache-restore.json when OUT is set.

The volume here is a local directory: this measures what the cache saves in hashing and copying on
one disk, not a network volume's latency or bandwidth, which only widen the gap.

usage (root, CRIU from `make setup`):
  .venv/bin/python bench/cache_restore.py [--gib 1] [--rounds 3] [--volume DIR] [--cache DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "bench"))

from fill_cpu import region_digest, start, worker  # noqa: E402
from podsnap.agent.cache import ArtifactCache, CacheKey  # noqa: E402
from podsnap.agent.engine_executor import EngineExecutor  # noqa: E402
from podsnap.engine import CaptureOptions, RestoreOptions, capture, kill_tree, restore, wait_gone  # noqa: E402

GIB = float(1 << 30)
SKIPS_HASHING = any(f.name == "verified_digests" for f in dataclasses.fields(RestoreOptions))


def drop_page_cache(root: Path) -> None:
    """Forget `root`'s files from the page cache, as a network volume's reader starts cold."""
    for path in root.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def timed_restore(artifact: Path, digest: str, want: str, *, verified: bool) -> dict[str, Any]:
    extra = {"verified_digests": True} if verified and SKIPS_HASHING else {}
    started = time.perf_counter()
    res = restore(artifact, RestoreOptions(expected_manifest_digest=digest, **extra))
    wall = time.perf_counter() - started
    try:
        ok = region_digest(res.pid) == want
    finally:
        kill_tree([res.pid])
        wait_gone(res.pid, timeout_s=30)
    return {"wall_s": wall, "phases_ms": res.timings_ms, "bit_exact": ok}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(float(sys.argv[2]), Path(sys.argv[3]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--gib", type=float, default=1.0, help="size of the worker's random region")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--volume", type=Path, default=None, help="the 'volume' directory (default: a temp dir)")
    ap.add_argument("--cache", type=Path, default=None, help="the cache root (default: a temp dir)")
    a = ap.parse_args()
    volume = a.volume or Path(tempfile.mkdtemp(prefix="podsnap-volume-", dir="/var/tmp"))
    cache_root = a.cache or Path(tempfile.mkdtemp(prefix="podsnap-cache-", dir="/var/tmp"))
    work = Path(tempfile.mkdtemp(prefix="podsnap-bench-"))
    # start() runs this file as the worker: keep its --worker entry point
    import fill_cpu

    fill_cpu.__file__ = __file__
    pid, want = start(a.gib, work)
    artifact = volume / "ns" / "snap"
    cap = capture(pid, artifact, CaptureOptions())
    wait_gone(pid, timeout_s=30)
    key = CacheKey("podsnapshotcontent-bench", cap.manifest_digest)
    cache = ArtifactCache(cache_root, EngineExecutor(), max_bytes=1 << 40, min_free_percent=0).open()
    rounds: list[dict[str, Any]] = []
    try:
        for _ in range(a.rounds):
            drop_page_cache(artifact)
            one: dict[str, Any] = {"volume": timed_restore(artifact, cap.manifest_digest, want, verified=False)}
            drop_page_cache(artifact)
            t = time.perf_counter()
            assert cache.fill(key, artifact)
            one["fill"] = {"wall_s": time.perf_counter() - t, "verify_rate": cache.verify_rate}
            lease = cache.lookup(key)
            assert lease is not None
            with lease:
                one["cache"] = timed_restore(lease.path, cap.manifest_digest, want, verified=True)
                one["cache-hashed"] = timed_restore(lease.path, cap.manifest_digest, want, verified=False)
            cache.drop(key, reason="bench")
            rounds.append(one)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if a.volume is None:
            shutil.rmtree(volume, ignore_errors=True)
        if a.cache is None:
            shutil.rmtree(cache_root, ignore_errors=True)
    size = cap.bytes_total
    doc: dict[str, Any] = {
        "gib": a.gib,
        "artifact_bytes": size,
        "cpus": os.cpu_count(),
        "engine_skips_hashing": SKIPS_HASHING,
        "rounds": rounds,
    }
    print(f"artifact {size / GIB:.2f} GiB, {os.cpu_count()} CPUs, engine verified_digests: {SKIPS_HASHING}")
    for name in ("volume", "fill", "cache", "cache-hashed"):
        wall = statistics.median(r[name]["wall_s"] for r in rounds)
        doc[f"{name}_s"] = wall
        line = f"{name:13s} {wall:6.2f} s"
        if "phases_ms" in rounds[0][name]:
            phases = {
                k: round(statistics.median(r[name]["phases_ms"].get(k, 0.0) for r in rounds))
                for k in rounds[0][name]["phases_ms"]
            }
            line += f"  {phases}"
        else:
            rate = statistics.median(r["fill"]["verify_rate"] for r in rounds)
            line += f"  ({size / GIB / wall:.2f} GiB/s overall; verification {rate / GIB:.2f} GiB/s)"
        print(line, flush=True)
    ok = all(r[n]["bit_exact"] for r in rounds for n in ("volume", "cache", "cache-hashed"))
    print(f"bit-exact: {ok}")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "cache-restore.json").write_text(json.dumps(doc, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
