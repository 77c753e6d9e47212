#!/usr/bin/env python3
"""Container images without Docker or a registry: docker-archive tarballs that `ctr images import` reads.

Two steps, so an unchanged base layer is written and hashed once and reused by every image:

  mkimage.py layer ROOTFS_OR_UPPER_DIR OUT.tar
      one uncompressed layer tar (deterministic order, numeric owners, overlayfs whiteouts turned into
      OCI `.wh.` entries, so an overlay upper dir becomes a proper diff layer); writes OUT.tar.sha256
      (the layer's diff id) next to it.

  mkimage.py archive SPEC.json OUT.tar
      one docker-archive holding every image of SPEC (layers shared between images are stored once).
      SPEC: {"images": [{"ref": "localhost/x:dev", "layers": ["a.tar", ...],
                          "config": {"Entrypoint": [...], "Cmd": [...], "Env": [...], ...}}]}
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import stat
import sys
import tarfile
from pathlib import Path
from typing import Any

# Fixed timestamps: the same inputs give byte-identical archives, so callers can skip re-imports.
EPOCH = 0
CREATED = "1970-01-01T00:00:00Z"
DEFAULT_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# kernel-provided mount points: keep the directories, never their contents
SKIP_CONTENTS = ("proc", "sys", "dev")


def _whiteout(path: Path) -> bool:
    """overlayfs marks a deleted lower file with a 0:0 character device in the upper dir."""
    st = path.lstat()
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _opaque(path: Path) -> bool:
    for attr in ("trusted.overlay.opaque", "user.overlay.opaque"):
        try:
            if os.getxattr(path, attr, follow_symlinks=False) == b"y":
                return True
        except OSError:
            continue
    return False


def _marker(tar: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.mtime = EPOCH
    tar.addfile(info, io.BytesIO(b""))


def write_layer(root: Path, out: Path) -> str:
    """Writes ROOT as one layer tar at OUT and returns its diff id (sha256 of the uncompressed tar)."""
    if not root.is_dir():
        sys.exit(f"mkimage layer: {root} is not a directory: pass the image root filesystem or an overlay upper dir")
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            filenames.sort()
            rel_dir = Path(dirpath).relative_to(root)
            if rel_dir.parts and rel_dir.parts[0] in SKIP_CONTENTS:
                dirnames.clear()
                continue
            for name in [*dirnames, *filenames]:
                full = Path(dirpath) / name
                arc = (rel_dir / name).as_posix()
                if _whiteout(full):
                    _marker(tar, (rel_dir / f".wh.{name}").as_posix())
                    continue
                info = tar.gettarinfo(str(full), arcname=arc)
                info.uname = info.gname = ""
                if info.isfile():
                    with full.open("rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
                if full.is_dir() and not full.is_symlink() and _opaque(full):
                    _marker(tar, f"{arc}/.wh..wh..opq")
    digest = hashlib.sha256()
    with tmp.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    diff_id = "sha256:" + digest.hexdigest()
    tmp.replace(out)
    Path(str(out) + ".sha256").write_text(diff_id + "\n")
    return diff_id


def _diff_id(layer: Path) -> str:
    sidecar = Path(str(layer) + ".sha256")
    if not sidecar.is_file():
        sys.exit(f"mkimage archive: {sidecar} missing: write the layer with `mkimage.py layer` first")
    return sidecar.read_text().strip()


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = EPOCH
    tar.addfile(info, io.BytesIO(data))


def write_archive(spec: dict[str, Any], out: Path) -> None:
    images = spec.get("images")
    if not isinstance(images, list) or not images:
        sys.exit("mkimage archive: SPEC needs a non-empty 'images' list")
    manifest: list[dict[str, Any]] = []
    repositories: dict[str, dict[str, str]] = {}
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w") as tar:
        written: set[str] = set()
        for image in images:
            ref = image.get("ref", "")
            if ":" not in ref.rsplit("/", 1)[-1]:
                sys.exit(f"mkimage archive: image ref {ref!r} needs a tag (e.g. localhost/podsnap-agent:dev)")
            layers = [Path(p) for p in image.get("layers", [])]
            if not layers:
                sys.exit(f"mkimage archive: image {ref} has no layers")
            diff_ids = [_diff_id(p) for p in layers]
            for layer, diff_id in zip(layers, diff_ids, strict=True):
                name = diff_id.split(":", 1)[1] + "/layer.tar"
                if name not in written:
                    info = tar.gettarinfo(str(layer), arcname=name)
                    info.mtime = EPOCH
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    with layer.open("rb") as f:
                        tar.addfile(info, f)
                    written.add(name)
            config = {"Env": [DEFAULT_ENV], "WorkingDir": "/", **image.get("config", {})}
            blob = json.dumps(
                {
                    "architecture": "amd64",
                    "os": "linux",
                    "created": CREATED,
                    "config": config,
                    "rootfs": {"type": "layers", "diff_ids": diff_ids},
                    "history": [
                        {"created": CREATED, "created_by": f"hack/cluster/mkimage.py {p.name}"} for p in layers
                    ],
                },
                sort_keys=True,
            ).encode()
            config_name = hashlib.sha256(blob).hexdigest() + ".json"
            _add_bytes(tar, config_name, blob)
            manifest.append(
                {
                    "Config": config_name,
                    "RepoTags": [ref],
                    "Layers": [d.split(":", 1)[1] + "/layer.tar" for d in diff_ids],
                }
            )
            repo, tag = ref.rsplit(":", 1)
            repositories.setdefault(repo, {})[tag] = diff_ids[-1].split(":", 1)[1]
        _add_bytes(tar, "manifest.json", json.dumps(manifest).encode())
        _add_bytes(tar, "repositories", json.dumps(repositories).encode())
    tmp.replace(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    layer = sub.add_parser("layer", help="write one layer tar from a directory")
    layer.add_argument("root", type=Path)
    layer.add_argument("out", type=Path)
    archive = sub.add_parser("archive", help="write a docker-archive of several images")
    archive.add_argument("spec", type=Path)
    archive.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.cmd == "layer":
        print(write_layer(args.root, args.out))
    else:
        write_archive(json.loads(args.spec.read_text()), args.out)
        print(args.out)


if __name__ == "__main__":
    main()
