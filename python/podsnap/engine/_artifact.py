"""Artifact directories: staged next to the destination, fsynced, renamed into place; verified on read.

Layout::

    ARTIFACT/
      manifest.json        the Manifest (written last)
      criu/                CRIU images (+ dump.log)
      <anything else>      listed in manifest.files (e.g. a rootfs diff, weight shards added later)

A reader trusts only files listed in the manifest and checks each one's size and digest before use
(`_digest`: the manifest's algorithm, BLAKE3 for new captures, SHA-256 before). Files larger than
CHUNK_BYTES (64 MiB; CRIU's pages image holds all of a worker's memory) are hashed in chunks in
parallel: their digest is the digest of the concatenated raw chunk digests, which the manifest lists
in `chunks`, so hashing runs at disk speed instead of one core's.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from podsnap.engine import _digest
from podsnap.engine._manifest import BULK_DIR, CHUNK_BYTES, CRIU_DIR, MANIFEST_NAME, FileEntry, Manifest
from podsnap.engine.errors import ArtifactError

#: files CRIU may write into the images dir during a restore, never part of the captured state
_RUNTIME_FILES = frozenset({f"{CRIU_DIR}/stats-restore", f"{CRIU_DIR}/restore.log"})

#: progress(done_bytes, total_bytes)
ByteProgress = Callable[[int, int], None]


def _walk(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def default_workers() -> int:
    return max(1, min(16, os.cpu_count() or 1))


def _digests(
    root: Path, rels: list[str], workers: int, progress: ByteProgress | None, algorithm: str
) -> dict[str, tuple[str, tuple[str, ...]]]:
    """rel -> (digest, chunk digests). Large files are hashed in CHUNK_BYTES pieces, in parallel."""
    sizes = {r: (root / r).stat().st_size for r in rels}
    tasks: list[tuple[str, int, int]] = []
    for rel in sorted(rels, key=lambda r: -sizes[r]):
        size = sizes[rel]
        if size <= CHUNK_BYTES:
            tasks.append((rel, 0, size))
        else:
            tasks.extend((rel, off, min(CHUNK_BYTES, size - off)) for off in range(0, size, CHUNK_BYTES))
    total = sum(sizes.values())
    done = 0
    per_file: dict[str, list[str]] = {r: [] for r in rels}
    # both hashes release the GIL on large buffers, so threads hash in parallel
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for (rel, _, length), digest in zip(
            tasks, pool.map(lambda t: _digest.of_range(algorithm, root / t[0], t[1], t[2]), tasks), strict=True
        ):
            per_file[rel].append(digest)
            done += length
            if progress is not None:
                progress(done, total)
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for rel, chunks in per_file.items():
        out[rel] = (
            (chunks[0], ()) if sizes[rel] <= CHUNK_BYTES else (_digest.chunked_root(algorithm, chunks), tuple(chunks))
        )
    return out


def describe_files(
    root: Path,
    *,
    workers: int | None = None,
    progress: ByteProgress | None = None,
    known: Mapping[str, tuple[int, Sequence[str]]] | None = None,
    algorithm: str = _digest.DEFAULT,
) -> tuple[FileEntry, ...]:
    """Every regular file under `root` except the manifest, with its size and digest by `algorithm`.

    `known`: rel -> (size, the digest of each CHUNK_BYTES chunk) taken earlier (`_prehash`, while CRIU
    wrote the file); used for a file whose size is still that size, which the caller guarantees it did
    not change otherwise, and that were hashed with `algorithm`."""
    rels = [p.relative_to(root).as_posix() for p in _walk(root)]
    rels = [r for r in rels if r != MANIFEST_NAME]
    sizes = {r: (root / r).stat().st_size for r in rels}
    given: dict[str, tuple[str, tuple[str, ...]]] = {}
    for rel, (size, chunks) in (known or {}).items():
        if sizes.get(rel) == size and chunks and len(chunks) == -(-size // CHUNK_BYTES):
            root_digest = chunks[0] if size <= CHUNK_BYTES else _digest.chunked_root(algorithm, chunks)
            given[rel] = (root_digest, () if size <= CHUNK_BYTES else tuple(chunks))
    rest = [r for r in rels if r not in given]
    digests = given | _digests(root, rest, workers or default_workers(), progress, algorithm)
    return tuple(FileEntry(path=r, size=sizes[r], digest=digests[r][0], chunks=digests[r][1]) for r in sorted(rels))


def fsync_path(path: Path, *, directory: bool = False) -> None:
    """fsync a file, or a directory's entries (`directory=True`): what makes a rename durable."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Staging:
    """A staging directory next to `dest`; `publish()` makes it `dest` atomically, `discard()` removes it."""

    def __init__(self, dest: Path) -> None:
        self.dest = dest.absolute()
        if self.dest.exists():
            raise ArtifactError(f"{self.dest} already exists: choose a new --out or remove it", path=str(self.dest))
        self.dest.parent.mkdir(parents=True, exist_ok=True)
        self.path = self.dest.parent / f".{self.dest.name}.staging-{uuid.uuid4().hex[:12]}"
        self.path.mkdir(mode=0o700)
        self.criu_dir = self.path / CRIU_DIR
        self.criu_dir.mkdir()

    def write_manifest(self, manifest: Manifest) -> None:
        tmp = self.path / f".{MANIFEST_NAME}.tmp"
        with tmp.open("w") as f:
            f.write(manifest.to_json())
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self.path / MANIFEST_NAME)

    def publish(self) -> Path:
        """fsync every file and directory, then rename into place (atomic on one filesystem)."""
        dirs = {self.path}
        for p in _walk(self.path):
            fsync_path(p)
            dirs.add(p.parent)
        for d in sorted(dirs, key=lambda d: -len(d.parts)):
            fsync_path(d, directory=True)
        if self.dest.exists():
            raise ArtifactError(f"{self.dest} appeared while capturing: not overwriting it", path=str(self.dest))
        self.path.rename(self.dest)
        fsync_path(self.dest.parent, directory=True)
        return self.dest

    def discard(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def parse_digest(value: str) -> str:
    """The hex of a sha256 written `sha256:<hex>` (as the operator records it) or bare; ValueError otherwise."""
    hexpart = value.removeprefix("sha256:").lower()
    if len(hexpart) != 64 or any(c not in "0123456789abcdef" for c in hexpart):
        raise ValueError(f"{value!r} is not a sha256 digest (sha256:<64 hex digits>)")
    return hexpart


def manifest_digest(artifact: Path) -> str:
    """`sha256:<hex>` of the artifact's manifest.json: what a caller records to trust the artifact later."""
    return f"sha256:{hashlib.sha256((artifact / MANIFEST_NAME).read_bytes()).hexdigest()}"


def read_manifest(artifact: Path, *, expected_digest: str | None = None) -> Manifest:
    """Parse `artifact`'s manifest. With `expected_digest` (sha256 of manifest.json, as recorded at capture)
    the bytes are checked BEFORE anything in them is parsed: an artifact vouches for itself no longer."""
    path = artifact / MANIFEST_NAME
    if not artifact.is_dir():
        raise ArtifactError(f"{artifact}: no such artifact directory", path=str(artifact))
    want = parse_digest(expected_digest) if expected_digest is not None else None
    try:
        _regular(artifact, MANIFEST_NAME)
        raw = path.read_bytes()
    except FileNotFoundError as exc:
        raise ArtifactError(
            f"{path}: missing; {artifact} is not a complete artifact (a capture that never finished?)", path=str(path)
        ) from exc
    if want is not None:
        got = hashlib.sha256(raw).hexdigest()
        if got != want:
            raise ArtifactError(
                f"{path}: sha256 {got[:16]}… is not the recorded {want[:16]}…: the artifact changed after its "
                "capture, or is another snapshot's",
                path=str(path),
            )
    try:
        text = raw.decode()
    except UnicodeDecodeError as exc:
        raise ArtifactError(f"{path}: not UTF-8 text ({exc})", path=str(path)) from exc
    return Manifest.from_json(text, where=str(path))


def _regular(artifact: Path, rel: str) -> int:
    """Size of the listed file `rel`, which must be a regular file reached through real directories only
    (lstat on every component: a symlink could point a reader anywhere). ArtifactError otherwise."""
    here = artifact
    parts = rel.split("/")
    for i, part in enumerate(parts):
        here = here / part
        st = here.lstat()  # FileNotFoundError: the caller says "missing"
        last = i == len(parts) - 1
        if (last and not stat.S_ISREG(st.st_mode)) or (not last and not stat.S_ISDIR(st.st_mode)):
            kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file" if last else "not a directory"
            raise ArtifactError(f"{here}: {kind}; an artifact holds only regular files", path=str(here))
    return st.st_size


def _unlisted(artifact: Path, top: str, listed: set[str]) -> None:
    """Refuse anything under `top` (CRIU's images, the bulk files) that the manifest does not list:
    CRIU reads images by name, so an extra one could change what is restored."""
    root = artifact / top
    if not root.exists():
        return
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            p = Path(dirpath) / name
            rel = p.relative_to(artifact).as_posix()
            if p.is_symlink() or (name in filenames and rel not in listed and rel not in _RUNTIME_FILES):
                raise ArtifactError(f"{p}: not listed in the manifest (tampered artifact?)", path=str(p))


def verify(
    artifact: Path,
    manifest: Manifest,
    *,
    workers: int | None = None,
    progress: ByteProgress | None = None,
    deferred: Iterable[str] = (),
    digests: bool = True,
) -> int:
    """Check every listed file (regular, its size, its digest) and that the images and bulk dirs hold nothing
    unlisted; return the bytes whose digests were checked.

    `deferred` names listed files whose digests the caller checks itself while it reads them (a restore's
    bulk files, verified chunk by chunk as they are written into the process): only type and size here.
    `digests=False` checks type and size of every file and nothing unlisted, and hashes none (the caller
    vouches for the digests: RestoreOptions.verified_digests).
    """
    listed = {f.path: f for f in manifest.files}
    if not any(p.startswith(f"{CRIU_DIR}/") for p in listed):
        raise ArtifactError(f"{artifact / MANIFEST_NAME}: lists no CRIU images", path=str(artifact / MANIFEST_NAME))
    for entry in manifest.files:
        path = artifact / entry.path
        try:
            size = _regular(artifact, entry.path)
        except FileNotFoundError as exc:
            raise ArtifactError(f"{path}: listed in the manifest but missing", path=str(path)) from exc
        if size != entry.size:
            raise ArtifactError(
                f"{path}: size {size} differs from the manifest's {entry.size} (truncated?)", path=str(path)
            )
    for top in (CRIU_DIR, BULK_DIR):
        _unlisted(artifact, top, set(listed))
    later = set(deferred)
    now = [rel for rel in listed if rel not in later] if digests else []
    found = _digests(artifact, now, workers or default_workers(), progress, manifest.digest)
    for rel in now:
        entry = listed[rel]
        got, chunks = found[rel]
        if got != entry.digest:
            where = ""
            bad = [i for i, (a, b) in enumerate(zip(chunks, entry.chunks, strict=False)) if a != b]
            if bad:
                where = f" (first bad chunk at byte {bad[0] * CHUNK_BYTES})"
            raise ArtifactError(
                f"{artifact / rel}: {manifest.digest} {got[:16]}… differs from the manifest's {entry.digest[:16]}…{where} "
                "(tampered or corrupted)",
                path=str(artifact / rel),
            )
    return sum(listed[rel].size for rel in now)


def remove(artifact: Path) -> None:
    """Delete an artifact: rename it aside first so no reader sees a half-deleted one."""
    if not artifact.exists():
        return
    aside = artifact.parent / f".{artifact.name}.deleting-{uuid.uuid4().hex[:8]}"
    with contextlib.suppress(OSError):
        artifact.rename(aside)
        artifact = aside
    shutil.rmtree(artifact, ignore_errors=True)
