"""The artifact manifest (`manifest.json`): what was captured, where, and every file's digest.

Versioned by `schemaVersion`; readers ignore unknown keys, so a newer writer's additions are safe, and
refuse a newer schema version with the fix ("upgrade podsnap"). `extra` holds free-form sections other
parts add (e.g. a rootfs diff), keyed by section name.

  1  CRIU's images hold all of the process memory (every artifact before the fast restore, and any
     capture with `fast_restore=False` or no large memory run).
  2  adds `bulk.extents`: large runs of private anonymous memory cut out of CRIU's pages images into
     raw files under `bulk/` (process, address, length, file, offset); a restore writes them into the
     stopped tree itself, checking each file chunk's digest as it reads it. Written only when there
     are extents, so an artifact without them stays readable by older podsnap.
  3  adds `digestAlgorithm` (`_digest`: BLAKE3 for new captures) and names each file's digest by it
     (`"blake3": hex` where schemas 1 and 2 wrote `"sha256": hex`); `bulk` stays optional. Written
     whenever the files are not SHA-256, so an older podsnap refuses the artifact ("upgrade podsnap")
     instead of comparing the wrong hash and calling it tampered.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from podsnap import __version__
from podsnap.engine import _digest
from podsnap.engine._host import HostFacts
from podsnap.engine._proctree import ProcInfo
from podsnap.engine.errors import ArtifactError

SCHEMA: str = "podsnap.io/artifact"
#: the newest schema this podsnap reads and writes
SCHEMA_VERSION: int = 3
MANIFEST_NAME: str = "manifest.json"
#: files above this size are digested in chunks of this size (see artifact.py)
CHUNK_BYTES: int = 64 << 20
#: CRIU's images live under this directory of the artifact
CRIU_DIR: str = "criu"
#: raw memory cut out of CRIU's images (schema 2) lives under this directory
BULK_DIR: str = "bulk"
PAGE_SIZE: int = 4096


@dataclass(frozen=True)
class FileEntry:
    """One file of the artifact: path relative to the artifact root, size in bytes, hex digest (by the
    manifest's `digestAlgorithm`).

    For files larger than `chunkBytes`, `chunks` lists each chunk's digest and `digest` is the digest
    of their concatenated raw digests.
    """

    path: str
    size: int
    digest: str
    chunks: tuple[str, ...] = ()

    def to_dict(self, algorithm: str = _digest.LEGACY) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "size": self.size, algorithm: self.digest}
        if self.chunks:
            out["chunks"] = list(self.chunks)
        return out


@dataclass(frozen=True)
class Extent:
    """`length` bytes of process `pid`'s memory at `vaddr`, stored at `offset` of the artifact file `file`.

    `pid` is the process as CRIU numbered it (its namespace PID: `ProcInfo.ns_pid`).
    """

    pid: int
    vaddr: int
    length: int
    file: str
    offset: int

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "vaddr": self.vaddr, "length": self.length, "file": self.file, "offset": self.offset}


@dataclass(frozen=True)
class Manifest:
    source: HostFacts
    #: the captured tree, root first; pids are host pids at capture time, nsPid as the pod saw them
    processes: tuple[ProcInfo, ...]
    #: host pids of the processes that held CUDA state (checkpointed through the driver)
    cuda_pids: tuple[int, ...]
    #: UUIDs of the GPUs the captured processes used (subset of source.gpus)
    cuda_gpu_uuids: tuple[str, ...]
    files: tuple[FileEntry, ...]
    #: True when CRIU ran inside the source's namespaces (restore must run inside a destination's)
    namespaced: bool = False
    criu_version: str = ""
    criu_options: tuple[str, ...] = ()
    timings_ms: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    created_at: str = ""
    podsnap_version: str = __version__
    #: memory runs kept out of CRIU's images (schema 2); empty: CRIU restores all memory itself
    bulk: tuple[Extent, ...] = ()
    #: the algorithm of every digest in `files` (schema 3; a manifest read without one is SHA-256)
    digest: str = _digest.DEFAULT

    @property
    def schema_version(self) -> int:
        if self.digest != _digest.LEGACY:
            return 3
        return 2 if self.bulk else 1

    @property
    def root(self) -> ProcInfo:
        return self.processes[0]

    @property
    def cuda_gpu_names(self) -> list[str]:
        """The models of the GPUs the captured processes used, one per GPU (all of the source's GPUs when
        the capture did not record which)."""
        used = set(self.cuda_gpu_uuids)
        gpus = [g for g in self.source.gpus if g.uuid in used] if used else list(self.source.gpus)
        return [g.name for g in gpus]

    @property
    def bulk_files(self) -> tuple[str, ...]:
        return tuple(sorted({e.file for e in self.bulk}))

    @property
    def bulk_bytes(self) -> int:
        return sum(e.length for e in self.bulk)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def criu_pages_bytes(self) -> int:
        """The pages CRIU itself restores."""
        return sum(f.size for f in self.files if f.path.startswith(f"{CRIU_DIR}/pages-"))

    @property
    def memory_bytes(self) -> int:
        """Host memory a restore needs: the dumped pages (GPU memory included, it travels in them)."""
        return self.criu_pages_bytes + self.bulk_bytes

    def to_dict(self) -> dict[str, Any]:
        return (
            {
                "schema": SCHEMA,
                "schemaVersion": self.schema_version,
                "podsnapVersion": self.podsnap_version,
                "createdAt": self.created_at,
                "source": self.source.to_dict(),
                "process": {
                    "namespaced": self.namespaced,
                    "tree": [p.to_dict() for p in self.processes],
                    "cudaPids": list(self.cuda_pids),
                    "cudaGpuUuids": list(self.cuda_gpu_uuids),
                },
                "criu": {"version": self.criu_version, "options": list(self.criu_options), "imagesDir": CRIU_DIR},
                "chunkBytes": CHUNK_BYTES,
                "files": [f.to_dict(self.digest) for f in self.files],
                "totals": {"files": len(self.files), "bytes": self.total_bytes, "memoryBytes": self.memory_bytes},
                "timingsMs": dict(self.timings_ms),
                "extra": dict(self.extra),
            }
            | ({"digestAlgorithm": self.digest} if self.schema_version >= 3 else {})
            | ({"bulk": {"pageSize": PAGE_SIZE, "extents": [e.to_dict() for e in self.bulk]}} if self.bulk else {})
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: Any, *, where: str = MANIFEST_NAME) -> Manifest:
        if not isinstance(data, dict):
            raise ArtifactError(f"{where}: expected a JSON object", path=where)
        if data.get("schema") != SCHEMA:
            raise ArtifactError(f"{where}: 'schema' must be {SCHEMA!r}, got {data.get('schema')!r}", path=where)
        version = data.get("schemaVersion")
        if not isinstance(version, int) or version < 1:
            raise ArtifactError(f"{where}: 'schemaVersion' must be a positive integer, got {version!r}", path=where)
        if version > SCHEMA_VERSION:
            raise ArtifactError(
                f"{where}: schemaVersion {version} is newer than this podsnap understands ({SCHEMA_VERSION}); "
                "upgrade podsnap",
                path=where,
                unsupported=True,
            )
        chunk_bytes = data.get("chunkBytes", CHUNK_BYTES)
        if chunk_bytes != CHUNK_BYTES:
            raise ArtifactError(
                f"{where}: chunkBytes {chunk_bytes!r} differs from this podsnap's {CHUNK_BYTES}; upgrade podsnap",
                path=where,
                unsupported=True,
            )
        algorithm = _digest.LEGACY
        if version >= 3:
            named = data.get("digestAlgorithm")
            if named not in _digest.ALGORITHMS:
                raise ArtifactError(
                    f"{where}: 'digestAlgorithm' {named!r} is not one this podsnap checks "
                    f"({', '.join(_digest.ALGORITHMS)}); upgrade podsnap",
                    path=where,
                    unsupported=True,
                )
            algorithm = str(named)
        elif "digestAlgorithm" in data:
            raise ArtifactError(
                f"{where}: 'digestAlgorithm' needs schemaVersion 3, this one says {version}", path=where
            )
        try:
            proc = data.get("process") or {}
            tree = [ProcInfo.from_dict(p) for p in proc.get("tree") or []]
            if not tree:
                raise ArtifactError(f"{where}: 'process.tree' is empty: nothing to restore", path=where)
            files = []
            for i, f in enumerate(data.get("files") or []):
                path = str(f["path"])
                if path.startswith("/") or ".." in path.split("/"):
                    raise ArtifactError(f"{where}: files[{i}].path {path!r} escapes the artifact", path=where)
                chunks = tuple(str(c) for c in f.get("chunks") or ())
                if algorithm not in f:
                    raise ArtifactError(f"{where}: files[{i}] ({path}) has no {algorithm!r} digest", path=where)
                files.append(FileEntry(path=path, size=int(f["size"]), digest=str(f[algorithm]), chunks=chunks))
            criu = data.get("criu") or {}
            processes = tuple(tree)
            bulk = _extents(data.get("bulk"), version, processes, files, where)
            return cls(
                source=HostFacts.from_dict(data.get("source") or {}),
                processes=processes,
                cuda_pids=tuple(int(p) for p in proc.get("cudaPids") or ()),
                cuda_gpu_uuids=tuple(str(u) for u in proc.get("cudaGpuUuids") or ()),
                files=tuple(files),
                namespaced=bool(proc.get("namespaced", False)),
                criu_version=str(criu.get("version", "")),
                criu_options=tuple(str(o) for o in criu.get("options") or ()),
                timings_ms={str(k): float(v) for k, v in (data.get("timingsMs") or {}).items()},
                extra=dict(data.get("extra") or {}),
                created_at=str(data.get("createdAt", "")),
                podsnap_version=str(data.get("podsnapVersion", "")),
                bulk=bulk,
                digest=algorithm,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"{where}: malformed manifest ({type(exc).__name__}: {exc})", path=where) from exc

    @classmethod
    def from_json(cls, text: str, *, where: str = MANIFEST_NAME) -> Manifest:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ArtifactError(f"{where}: not valid JSON ({exc})", path=where) from exc
        return cls.from_dict(data, where=where)


def _extents(
    section: Any, version: int, processes: tuple[ProcInfo, ...], files: list[FileEntry], where: str
) -> tuple[Extent, ...]:
    """The `bulk` section, checked against the rest of the manifest: every extent must name a process of
    the tree, a listed file under bulk/ and a page-aligned range inside it; no two may overlap."""
    if version == 1:
        if section is not None:
            raise ArtifactError(f"{where}: a 'bulk' section needs schemaVersion 2, this one says 1", path=where)
        return ()
    if version >= 3 and section is None:
        return ()
    if not isinstance(section, dict) or not section.get("extents"):
        raise ArtifactError(f"{where}: schemaVersion {version} needs a non-empty 'bulk.extents'", path=where)
    if section.get("pageSize", PAGE_SIZE) != PAGE_SIZE:
        raise ArtifactError(f"{where}: bulk.pageSize {section.get('pageSize')!r} is not {PAGE_SIZE}", path=where)
    sizes = {f.path: f.size for f in files}
    pids = {p.ns_pid for p in processes}
    out: list[Extent] = []
    for i, e in enumerate(section["extents"]):
        ext = Extent(
            pid=int(e["pid"]),
            vaddr=int(e["vaddr"]),
            length=int(e["length"]),
            file=str(e["file"]),
            offset=int(e["offset"]),
        )
        bad = ""
        if ext.pid not in pids:
            bad = f"pid {ext.pid} is not in process.tree"
        elif not ext.file.startswith(f"{BULK_DIR}/") or ext.file not in sizes:
            bad = f"file {ext.file!r} is not a listed file under {BULK_DIR}/"
        elif ext.length <= 0 or min(ext.vaddr, ext.offset) < 0 or (ext.vaddr | ext.length | ext.offset) % PAGE_SIZE:
            bad = "vaddr, length and offset must be page-aligned, length positive"
        elif ext.offset + ext.length > sizes[ext.file]:
            bad = f"bytes {ext.offset}..{ext.offset + ext.length} lie beyond the end of {ext.file}"
        if bad:
            raise ArtifactError(f"{where}: bulk.extents[{i}]: {bad}", path=where)
        out.append(ext)
    ordered = sorted(out, key=lambda x: (x.pid, x.vaddr))
    for a, b in itertools.pairwise(ordered):
        if a.pid == b.pid and a.vaddr + a.length > b.vaddr:
            raise ArtifactError(f"{where}: bulk extents of pid {a.pid} overlap at {b.vaddr:#x}", path=where)
    return tuple(out)
