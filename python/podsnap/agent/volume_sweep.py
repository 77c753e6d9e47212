"""What a dead agent or a deleted snapshot leaves on the artifact volume, removed where it is safe:

- next to an artifact, the capture staging dirs and artifacts renamed aside for deletion
  (`remove_leftovers`: only for a content no capture of this process is writing; see the callers);
- under the artifact root, namespace directories left empty when their last artifact went
  (`remove_empty_namespace_dirs`, at start and every SWEEP_S). Every agent mounts the shared volume and
  may do this: `rmdir` removes only an empty directory, and one a capture touched in the last
  EMPTY_DIR_GRACE_S is kept (the executor touches it before the capture stages in it), so a capture that
  has just made its namespace directory never finds it gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from pathlib import Path
from typing import Any

import kopf

from podsnap.agent.runtime import ctx_of, registry

#: what a capture (the engine's staging dir) or a deletion (the artifact renamed aside) leaves next to an
#: artifact directory when the agent dies in the middle of it
LEFTOVER_PATTERNS = (".{name}.staging-*", ".{name}.deleting-*")
#: how often the empty namespace directories are looked for
SWEEP_S = 600.0
#: a namespace directory changed more recently than this is kept even when empty
EMPTY_DIR_GRACE_S = 600.0


def remove_leftovers(root: Path, target: Path) -> list[str]:
    """Remove the staging and `.deleting-*` dirs next to artifact dir `target`; returns those removed,
    relative to `root`. Only for a content no capture of this process is writing (see callers)."""
    removed: list[str] = []
    if not target.parent.is_dir():
        return removed
    for pattern in LEFTOVER_PATTERNS:
        for leftover in target.parent.glob(pattern.format(name=target.name)):
            shutil.rmtree(leftover, ignore_errors=True)
            if not leftover.exists():
                removed.append(str(leftover.relative_to(root.resolve())))
    return removed


def remove_empty_namespace_dirs(root: Path, grace_s: float = EMPTY_DIR_GRACE_S) -> list[str]:
    """Remove the empty namespace directories under the artifact root not changed for `grace_s`; returns
    their names. Directories of podsnap's own (`.logs`, `.journal`) start with a dot and are never touched."""
    removed: list[str] = []
    if not root.is_dir():
        return removed
    now = time.time()
    for entry in sorted(root.iterdir()):
        if entry.name.startswith(".") or entry.is_symlink() or not entry.is_dir():
            continue
        with contextlib.suppress(OSError):  # not empty (any more), or gone: not ours to remove
            if now - entry.stat().st_mtime >= grace_s:
                entry.rmdir()
                removed.append(entry.name)
    return removed


async def _sweep_loop(root: Path, logger: Any) -> None:
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(SWEEP_S)
        try:
            for name in await loop.run_in_executor(None, remove_empty_namespace_dirs, root):
                logger.info("removed the empty namespace directory %s of the artifact volume", name)
        except Exception as exc:  # the volume may be away for a while; the next round retries
            logger.warning("sweep of empty namespace directories failed: %s", exc)


@kopf.on.startup(registry=registry)
async def start_volume_sweep(*, memo: Any, logger: kopf.Logger, **_: Any) -> None:
    ctx = ctx_of(memo)
    root = ctx.config.artifact_root
    for name in await asyncio.get_running_loop().run_in_executor(None, remove_empty_namespace_dirs, root):
        logger.info("removed the empty namespace directory %s of the artifact volume", name)
    ctx.background.append(asyncio.create_task(_sweep_loop(root, logger)))


@kopf.on.cleanup(registry=registry)
async def stop_volume_sweep(*, memo: Any, **_: Any) -> None:
    for task in ctx_of(memo).background:
        task.cancel()
