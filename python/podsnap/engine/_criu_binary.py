"""Which CRIU to run: lookup, bundle unwrapping, version, and the libraries it needs inside a container.

Lookup order: an explicit path, `PODSNAP_CRIU`, `.tools/bin/criu` of this checkout, `criu` on PATH. A
bundle wrapper (`criu.sh` next to a `criu` ELF and `lib/`, as `make setup` builds) is unwrapped so the
ELF can be run directly with `LD_LIBRARY_PATH`, which namespace mode needs.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from podsnap.engine.errors import CriuError

MIN_MAJOR = 4
REPO_ROOT = Path(__file__).resolve().parents[3]
#: libraries that must come from the container itself (they must match its dynamic loader)
GLIBC_LIB = re.compile(r"/(libc|libm|libpthread|libdl|librt|libresolv|ld-linux[^/]*)[.-]")


@dataclass(frozen=True)
class CriuBinary:
    """How to run CRIU: `exe` (an ELF, or a wrapper script usable only on the host) and its `lib_dir`."""

    exe: Path
    lib_dir: Path | None = None

    @property
    def is_elf(self) -> bool:
        return _is_elf(self.exe)

    def env(self, lib_dir: str | None = None) -> dict[str, str]:
        env = dict(os.environ)
        lib = lib_dir or (str(self.lib_dir) if self.lib_dir else None)
        if lib:
            env["LD_LIBRARY_PATH"] = lib + (f":{env['LD_LIBRARY_PATH']}" if env.get("LD_LIBRARY_PATH") else "")
        return env


def _is_elf(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(4) == b"\x7fELF"


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


def collect_namespace_libs(binary: CriuBinary) -> Path:
    """A private copy of every library `ldd` resolves for CRIU here except glibc's (cached per binary).

    For a CRIU without a bundle `lib/` (e.g. a distribution's): the container has none of them, and
    only glibc may come from the container (its loader must match its libc).
    """
    out = subprocess.run(
        ["ldd", str(binary.exe)], check=False, capture_output=True, text=True, timeout=30, env=binary.env()
    )
    libs = [
        Path(parts[2])
        for parts in (line.split() for line in out.stdout.splitlines())
        if len(parts) >= 3 and parts[1] == "=>" and parts[2].startswith("/") and not GLIBC_LIB.search(parts[2])
    ]
    missing = [line.split()[0] for line in out.stdout.splitlines() if "not found" in line]
    if missing:
        raise CriuError(f"{binary.exe} needs libraries not found here: {', '.join(missing)}")
    st = binary.exe.stat()
    key = f"{binary.exe}:{st.st_size}:{st.st_mtime_ns}".encode()
    cache = Path(tempfile.gettempdir()) / f"podsnap-criu-libs-{hashlib.sha256(key).hexdigest()[:12]}"
    if not cache.is_dir():
        stage = Path(tempfile.mkdtemp(prefix=cache.name + ".", dir=cache.parent))
        for lib in libs:
            shutil.copy2(lib, stage / lib.name)
        with contextlib.suppress(OSError):  # a concurrent copy may have won; either is complete
            stage.rename(cache)
        shutil.rmtree(stage, ignore_errors=True)
    return cache
