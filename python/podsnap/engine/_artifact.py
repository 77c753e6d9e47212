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

An artifact lives on a volume others may write (another NFS client, or a server that answers a second
read with other bytes), so a check proves nothing about a later read of the same path. Every file is
opened component by component without following a symlink, and what CRIU will read is not read from the
volume again: `verify(copy_to=...)` copies CRIU's images into a private node-local dir, hashing the
bytes it writes, and the restore points CRIU at that copy. manifest.json is read only up to
MANIFEST_MAX_BYTES, from a no-follow fd, before its digest is compared.
"""

from __future__ import annotations

import contextlib
import errno
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

#: what one read takes of a file being hashed (and copied)
_READ = 4 << 20

#: progress(done_bytes, total_bytes)
ByteProgress = Callable[[int, int], None]

#: the largest manifest.json a reader accepts, or a capture writes. A real one holds a line per file, per
#: 64 MiB chunk and per bulk extent (at least DEFAULT_MIN_RUN each): a few hundred KiB even for a worker of
#: hundreds of GiB. Anything larger is refused before a byte of it is read, so a sparse multi-GB file
#: planted on the volume costs a reader nothing (every restore, prefetch and periodic check reads one).
MANIFEST_MAX_BYTES = 16 << 20


def _walk(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def default_workers() -> int:
    return max(1, min(16, os.cpu_count() or 1))


def _open_beneath(root: Path, rel: str) -> int:
    """A read fd of the regular file `rel` under `root`, every component opened without following a
    symlink: one swapped in after the `lstat` checks fails here instead of being followed."""
    parts = rel.split("/")
    if not rel or any(p in ("", ".", "..") for p in parts):
        raise ArtifactError(f"{root / rel}: not a plain path inside the artifact", path=str(root / rel))
    here = root
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, part in enumerate(parts):
            here = here / part
            last = i == len(parts) - 1
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_NONBLOCK if last else os.O_DIRECTORY)
            try:
                nxt = os.open(part, flags, dir_fd=fd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                raise ArtifactError(f"{here}: a symlink or not a directory; an artifact holds only regular files",
                                    path=str(here)) from exc  # fmt: skip
            os.close(fd)
            fd = nxt
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ArtifactError(f"{here}: not a regular file; an artifact holds only regular files", path=str(here))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _hash_range(algorithm: str, root: Path, rel: str, offset: int, length: int, *, copy: Path | None) -> str:
    """The digest of `length` bytes of `rel` from `offset`, read through a no-follow fd; with `copy`, those
    same bytes (what was hashed, not a second read) are written at the same offset of the file `copy`."""
    h = _digest.new(algorithm)
    src = _open_beneath(root, rel)
    dst = os.open(copy, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC) if copy is not None else None
    try:
        done = 0
        while done < length:
            data = os.pread(src, min(_READ, length - done), offset + done)
            if not data:
                raise ArtifactError(
                    f"{root / rel}: ended at byte {offset + done}, {length - done} bytes short of its size "
                    "(truncated while read?)",
                    path=str(root / rel),
                )
            h.update(data)
            if dst is not None:
                _write_all(dst, data, offset + done)
            done += len(data)
    finally:
        os.close(src)
        if dst is not None:
            os.close(dst)
    return h.hexdigest()


def _digests(
    root: Path,
    sizes: Mapping[str, int],
    workers: int,
    progress: ByteProgress | None,
    algorithm: str,
    *,
    copies: Mapping[str, Path] | None = None,
) -> dict[str, tuple[str, tuple[str, ...]]]:
    """rel -> (digest, chunk digests) of the first `sizes[rel]` bytes of each file. Large files are hashed
    in CHUNK_BYTES pieces, in parallel. `copies`: rel -> an existing empty file the bytes are copied into."""
    rels = list(sizes)
    copies = copies or {}
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

    def run(t: tuple[str, int, int]) -> str:
        return _hash_range(algorithm, root, t[0], t[1], t[2], copy=copies.get(t[0]))

    # both hashes release the GIL on large buffers, so threads hash in parallel
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for (rel, _, length), digest in zip(tasks, pool.map(run, tasks), strict=True):
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

    `known`: rel -> (size, the digest of each CHUNK_BYTES chunk, one for an empty file) taken earlier by
    `algorithm` from the bytes the writer left (`_prehash` while CRIU wrote a pages image, `hash_files`
    right after the dump). They are binding: the staging dir is on a volume others may write, so a file
    whose size changed since, or that is gone, fails here (ArtifactError) instead of being hashed again
    as the volume now holds it; one changed without a change of size keeps its earlier digest, and the
    restore refuses it. The caller drops the files it rewrote itself (the cut's)."""
    rels = [p.relative_to(root).as_posix() for p in _walk(root)]
    rels = [r for r in rels if r != MANIFEST_NAME]
    sizes = {r: (root / r).stat().st_size for r in rels}
    given: dict[str, tuple[str, tuple[str, ...]]] = {}
    for rel, (size, chunks) in (known or {}).items():
        if sizes.get(rel) != size:
            now = "is gone" if rel not in sizes else f"has {sizes[rel]} bytes"
            raise ArtifactError(
                f"{root / rel}: {now}, not the {size} it had when hashed: changed on the volume while capturing",
                path=str(root / rel),
            )
        if len(chunks) != max(1, -(-size // CHUNK_BYTES)):
            raise ValueError(f"describe_files: {len(chunks)} chunk digests for {rel} of {size} bytes")
        root_digest = chunks[0] if size <= CHUNK_BYTES else _digest.chunked_root(algorithm, chunks)
        given[rel] = (root_digest, () if size <= CHUNK_BYTES else tuple(chunks))
    rest = {r: sizes[r] for r in rels if r not in given}
    digests = given | _digests(root, rest, workers or default_workers(), progress, algorithm)
    return tuple(FileEntry(path=r, size=sizes[r], digest=digests[r][0], chunks=digests[r][1]) for r in sorted(rels))


def hash_files(
    root: Path, rels: Iterable[str], *, workers: int | None = None, algorithm: str = _digest.DEFAULT
) -> dict[str, tuple[int, list[str]]]:
    """rel -> (size, chunk digests) of each regular file `rel` under `root`, read through no-follow fds:
    the `known` of `describe_files`, taken as early as the caller can (a symlink fails: ArtifactError)."""
    sizes = {rel: _regular(root, rel) for rel in rels}
    found = _digests(root, sizes, workers or default_workers(), None, algorithm)
    return {rel: (sizes[rel], list(found[rel][1]) or [found[rel][0]]) for rel in sizes}


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
        text = manifest.to_json()
        if len(text.encode()) > MANIFEST_MAX_BYTES:
            # no reader would take it: fail the capture now rather than publish an artifact nothing restores
            raise ArtifactError(
                f"{self.dest / MANIFEST_NAME}: {len(text.encode())} bytes, more than the {MANIFEST_MAX_BYTES} a "
                "manifest may have (MANIFEST_MAX_BYTES): too many bulk extents; capture with a larger "
                "bulk_min_run_bytes",
                path=str(self.dest / MANIFEST_NAME),
            )
        tmp = self.path / f".{MANIFEST_NAME}.tmp"
        with tmp.open("w") as f:
            f.write(text)
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


def _manifest_bytes(artifact: Path) -> bytes:
    """manifest.json's bytes, read from a no-follow fd and never more than MANIFEST_MAX_BYTES: a huge (or
    sparse) file is refused by its size before anything is read. ArtifactError otherwise."""
    path = artifact / MANIFEST_NAME
    try:
        fd = _open_beneath(artifact, MANIFEST_NAME)
    except FileNotFoundError as exc:
        raise ArtifactError(
            f"{path}: missing; {artifact} is not a complete artifact (a capture that never finished?)", path=str(path)
        ) from exc
    try:
        size = os.fstat(fd).st_size
        too_big = f"more than the {MANIFEST_MAX_BYTES} bytes a manifest may have (MANIFEST_MAX_BYTES): not a "
        if size > MANIFEST_MAX_BYTES:
            raise ArtifactError(f"{path}: {size} bytes, {too_big}podsnap manifest (tampered?)", path=str(path))
        chunks: list[bytes] = []
        got = 0
        while got <= MANIFEST_MAX_BYTES:  # it may grow while read: never past the cap
            data = os.read(fd, min(_READ, MANIFEST_MAX_BYTES + 1 - got))
            if not data:
                break
            chunks.append(data)
            got += len(data)
        if got > MANIFEST_MAX_BYTES:
            raise ArtifactError(f"{path}: grew while read to {too_big}podsnap manifest (tampered?)", path=str(path))
        return b"".join(chunks)
    finally:
        os.close(fd)


def manifest_digest(artifact: Path) -> str:
    """`sha256:<hex>` of the artifact's manifest.json: what a caller records to trust the artifact later."""
    return f"sha256:{hashlib.sha256(_manifest_bytes(artifact)).hexdigest()}"


def read_manifest(artifact: Path, *, expected_digest: str | None = None) -> Manifest:
    """Parse `artifact`'s manifest. With `expected_digest` (sha256 of manifest.json, as recorded at capture)
    the bytes are checked BEFORE anything in them is parsed: an artifact vouches for itself no longer."""
    path = artifact / MANIFEST_NAME
    if not artifact.is_dir():
        raise ArtifactError(f"{artifact}: no such artifact directory", path=str(artifact))
    want = parse_digest(expected_digest) if expected_digest is not None else None
    raw = _manifest_bytes(artifact)
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


def _copy_targets(rels: list[str], copy_to: Path) -> dict[str, Path]:
    """rel -> an empty file of ours under `copy_to` for each listed file under criu/ (the images dir's
    layout kept): created exclusively, mode 0600, in dirs of mode 0700."""
    out: dict[str, Path] = {}
    for rel in rels:
        dest = copy_to / rel.removeprefix(f"{CRIU_DIR}/")
        dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.close(os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
        out[rel] = dest
    return out


def verify(
    artifact: Path,
    manifest: Manifest,
    *,
    workers: int | None = None,
    progress: ByteProgress | None = None,
    deferred: Iterable[str] = (),
    digests: bool = True,
    copy_to: Path | None = None,
) -> int:
    """Check every listed file (regular, its size, its digest) and that the images and bulk dirs hold nothing
    unlisted; return the bytes whose digests were checked.

    `deferred` names listed files whose digests the caller checks itself while it reads them (a restore's
    bulk files, verified chunk by chunk as they are written into the process): only type and size here.
    `digests=False` checks type and size of every file and nothing unlisted, and hashes none (the caller
    vouches for the digests: RestoreOptions.verified_digests).
    `copy_to` (an empty dir only this process writes, on node-local storage): every listed file under
    criu/ is copied there as it is hashed, so its digest is the digest of the copy's bytes, and CRIU reads
    the copy; the artifact's images are read once, and their later changes reach nothing.
    """
    listed = {f.path: f for f in manifest.files}
    if not any(p.startswith(f"{CRIU_DIR}/") for p in listed):
        raise ArtifactError(f"{artifact / MANIFEST_NAME}: lists no CRIU images", path=str(artifact / MANIFEST_NAME))
    if copy_to is not None and not digests:
        raise ValueError("verify: copy_to hashes what it copies; it cannot be given with digests=False")
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
    images = [r for r in now if r.startswith(f"{CRIU_DIR}/")]
    copies = _copy_targets(images, copy_to) if copy_to is not None else {}
    sizes = {rel: listed[rel].size for rel in now}
    found = _digests(artifact, sizes, workers or default_workers(), progress, manifest.digest, copies=copies)
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
