"""Which CRIU to run: lookup, bundle unwrapping, version, and whether it may run inside a container.

Lookup order: an explicit path, `PODSNAP_CRIU`, `.tools/bin/criu` of this checkout, `criu` on PATH. A
bundle wrapper (`criu.sh` next to a `criu` ELF, and `lib/` for a dynamic build) is unwrapped so the
ELF itself is run. Only a statically linked CRIU (`make setup` builds one) may run inside a container:
the kernel would load a dynamic one with the container's ELF interpreter and libc.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

from podsnap.engine.errors import CriuError

MIN_MAJOR = 4
REPO_ROOT = Path(__file__).resolve().parents[3]
_PT_DYNAMIC, _PT_INTERP, _DT_NEEDED = 2, 3, 1


@dataclass(frozen=True)
class CriuBinary:
    """How to run CRIU: `exe` (an ELF, or a wrapper script usable only on the host) and its `lib_dir`."""

    exe: Path
    lib_dir: Path | None = None

    @property
    def is_elf(self) -> bool:
        return _is_elf(self.exe)

    @property
    def is_static(self) -> bool:
        """True when the kernel runs `exe` without an ELF interpreter and it needs no shared library."""
        return linked_statically(self.exe)

    def env(self, lib_dir: str | None = None) -> dict[str, str]:
        env = dict(os.environ)
        lib = lib_dir or (str(self.lib_dir) if self.lib_dir else None)
        if lib:
            env["LD_LIBRARY_PATH"] = lib + (f":{env['LD_LIBRARY_PATH']}" if env.get("LD_LIBRARY_PATH") else "")
        return env


def _is_elf(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(4) == b"\x7fELF"


def linked_statically(path: Path) -> bool:
    """Whether the ELF64 little-endian file at `path` has no PT_INTERP and no DT_NEEDED (static or static-pie).

    Anything else, including a file this cannot parse, counts as dynamic.
    """
    try:
        data = path.read_bytes()
        if data[:4] != b"\x7fELF" or data[4:6] != b"\x02\x01":
            return False
        (phoff,) = struct.unpack_from("<Q", data, 32)
        phentsize, phnum = struct.unpack_from("<HH", data, 54)
        for i in range(phnum):
            p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
            if p_type == _PT_INTERP:
                return False
            if p_type == _PT_DYNAMIC:
                for off in range(p_offset, p_offset + p_filesz - 15, 16):
                    (tag,) = struct.unpack_from("<q", data, off)
                    if tag == _DT_NEEDED:
                        return False
                    if tag == 0:
                        break
    except (OSError, struct.error):
        return False
    return True


def _unwrap(path: Path) -> CriuBinary:
    real = path.resolve()
    if _is_elf(real):
        lib = real.parent / "lib"
        return CriuBinary(real, lib if lib.is_dir() else None)
    # a bundle wrapper: run its ELF directly (so namespace mode can reach it through a directory fd)
    for name in ("criu", "criu.bin"):
        elf = real.parent / name
        if elf != real and elf.is_file() and _is_elf(elf):
            lib = real.parent / "lib"
            return CriuBinary(elf, lib if lib.is_dir() else None)
    return CriuBinary(real, None)


def find_binary(explicit: str | os.PathLike[str] | None = None) -> CriuBinary:
    """Locate CRIU: explicit path, `PODSNAP_CRIU`, `.tools/bin/criu`, PATH; raise CriuError with the fix."""
    candidates: list[tuple[str, str | None]] = [
        ("argument", str(explicit) if explicit else None),
        ("PODSNAP_CRIU", os.environ.get("PODSNAP_CRIU")),
        (".tools/bin/criu", str(REPO_ROOT / ".tools" / "bin" / "criu")),
        ("PATH", shutil.which("criu")),
    ]
    for source, value in candidates:
        if not value:
            continue
        path = Path(value)
        if path.is_file() and os.access(path, os.X_OK):
            return _unwrap(path)
        if source in ("argument", "PODSNAP_CRIU"):
            raise CriuError(f"CRIU not found at {value} (from {source}): point it at a criu >= 4 binary")
    raise CriuError("CRIU not found (PODSNAP_CRIU, .tools/bin/criu, PATH): run `make setup` to build CRIU 4")


def read_version(binary: CriuBinary) -> str:
    """CRIU's version ("4.2.1"); raise CriuError when older than 4 or not runnable."""
    try:
        out = subprocess.run(
            [str(binary.exe), "--version"],
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
            env=binary.env(),
        )
    except OSError as exc:
        raise CriuError(f"cannot run {binary.exe}: {exc} (run `make setup`)") from exc
    m = re.search(r"Version:\s*(\d+)\.(\d+)(?:\.(\d+))?", out.stdout)
    if out.returncode != 0 or not m:
        raise CriuError(f"{binary.exe} --version failed: {(out.stdout + out.stderr).strip()[:300]}")
    if int(m.group(1)) < MIN_MAJOR:
        raise CriuError(
            f"CRIU {m.group(0).split()[-1]} is too old: podsnap needs CRIU >= {MIN_MAJOR} (run `make setup`)"
        )
    return ".".join(g for g in m.groups() if g is not None)
