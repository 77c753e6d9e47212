#!/usr/bin/env bash
# Builds podsnap's images without Docker or a registry, into one docker-archive that up.sh imports
# into containerd: localhost/podsnap-{operator,agent,demo}:dev and localhost/pause:dev.
# Layers (each cached in $PODSNAP_CACHE/images, keyed by a hash of its inputs):
#   base  Debian bookworm minbase (debootstrap) + python3 + a venv at /opt/podsnap/venv holding
#         podsnap's dependencies from python/pyproject.toml       (≈2-3 min cold, shared by all three)
#   criu  the static CRIU 4.2 of hack/build-criu.sh at /opt/podsnap/criu (agent only)
#   app   podsnap itself, pip-installed from the working tree     (seconds: rebuilt on every change)
#   pause a static pause binary for pod sandboxes
# Same content as images/*/Dockerfile (what users with Docker build and push).
# usage: hack/cluster/build-images.sh            (prints the archive path)
set -euo pipefail
source "$(dirname "$0")/common.sh"
need_root
T0=$(date +%s)
PY=$REPO_ROOT/.venv/bin/python; [ -x "$PY" ] || PY=python3
MK=("$PY" "$CLUSTER_SRC/mkimage.py")
mkdir -p "$IMAGES_CACHE"
exec 8>"$IMAGES_CACHE/.lock"; flock 8
sha() { sha256sum | cut -c1-16; }
SUITE=bookworm
PACKAGES=python3,python3-venv,procps,ca-certificates
DEPS=$("$PY" -c 'import sys, tomllib; print(" ".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))' "$REPO_ROOT/python/pyproject.toml")
BASE_KEY=$( (echo "$SUITE $PACKAGES setuptools wheel $DEPS v2") | sha)
BASE=$IMAGES_CACHE/base-$BASE_KEY

# chroot_run ROOT CMD...: runs CMD inside ROOT with /proc and /dev; no network needed inside (pip
# installs from wheels this host downloaded with its own pip configuration: mirrors, CAs, proxies)
chroot_run() {
  local root=$1; shift
  mount -t proc proc "$root/proc"; mount --bind /dev "$root/dev"
  local rc=0; chroot "$root" env -i HOME=/root PYTHONDONTWRITEBYTECODE=1 PATH=/opt/podsnap/venv/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@" || rc=$?
  umount "$root/dev"; umount "$root/proc"
  return $rc
}

# --- base ---------------------------------------------------------------------------------------------
if [ ! -f "$BASE/layer.tar.sha256" ]; then
  apt_install debootstrap
  clog "building the base image layer ($SUITE minbase + python3 + $DEPS): ≈3 min, cached as $BASE"
  mkdir -p "$BASE.tmp"
  if [ ! -f "$BASE.tmp/debootstrap.done" ]; then
    rm -rf "$BASE.tmp/rootfs"
    debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$BASE.tmp/rootfs" "$(debian_mirror)" >"$BASE.tmp/debootstrap.log" 2>&1 \
      || { tail -20 "$BASE.tmp/debootstrap.log" >&2; die "debootstrap $SUITE failed (log: $BASE.tmp/debootstrap.log)"; }
    touch "$BASE.tmp/debootstrap.done"
  fi
  rm -rf "$BASE.tmp/rootfs/tmp/wheels"; mkdir -p "$BASE.tmp/rootfs/tmp/wheels"
  # shellcheck disable=SC2086
  "$PY" -m pip download -q -d "$BASE.tmp/rootfs/tmp/wheels" pip setuptools wheel $DEPS >"$BASE.tmp/pip.log" 2>&1 \
    || { grep -v 'is ignored' "$BASE.tmp/pip.log" | tail -20 >&2; die "pip download of podsnap's dependencies failed (PyPI reachable?)"; }
  # shellcheck disable=SC2086
  chroot_run "$BASE.tmp/rootfs" sh -c "python3 -m venv /opt/podsnap/venv && pip install -q --no-index --find-links /tmp/wheels --upgrade pip setuptools wheel && pip install -q --no-index --find-links /tmp/wheels $(printf "'%s' " $DEPS)" \
    || die "pip install of podsnap's dependencies into the base image failed"
  rm -rf "$BASE.tmp/rootfs/tmp/wheels" "$BASE.tmp/rootfs"/var/cache/apt/archives/*.deb "$BASE.tmp/rootfs"/var/lib/apt/lists/* "$BASE.tmp/rootfs"/var/log/*.log
  "${MK[@]}" layer "$BASE.tmp/rootfs" "$BASE.tmp/layer.tar" >/dev/null
  rm -rf "$BASE"; mv "$BASE.tmp" "$BASE"
  for old in "$IMAGES_CACHE"/base-*; do [ "$old" = "$BASE" ] || rm -rf "$old"; done
fi

# --- criu (agent) ---------------------------------------------------------------------------------------
CRIU_DIR=$(readlink -f "$REPO_ROOT/.tools/criu" 2>/dev/null || true)
[ -x "$CRIU_DIR/criu" ] || CRIU_DIR=$("$REPO_ROOT/hack/build-criu.sh")
CRIU_KEY=$( (cd "$CRIU_DIR" && find . -type f | sort | xargs sha256sum) | sha)
CRIU_LAYER=$IMAGES_CACHE/criu-$CRIU_KEY.tar
if [ ! -f "$CRIU_LAYER.sha256" ]; then
  S=$(mktemp -d); mkdir -p "$S/opt/podsnap" "$S/usr/local/bin"
  cp -rL "$CRIU_DIR" "$S/opt/podsnap/criu"; ln -s /opt/podsnap/criu/criu "$S/usr/local/bin/criu"
  "${MK[@]}" layer "$S" "$CRIU_LAYER" >/dev/null; rm -rf "$S"
fi

# --- pause ----------------------------------------------------------------------------------------------
PAUSE_KEY=$(sha <"$CLUSTER_SRC/pause.c")
PAUSE_LAYER=$IMAGES_CACHE/pause-$PAUSE_KEY.tar
if [ ! -f "$PAUSE_LAYER.sha256" ]; then
  apt_install gcc libc6-dev
  S=$(mktemp -d); gcc -Os -static -o "$S/pause" "$CLUSTER_SRC/pause.c"; strip "$S/pause"
  "${MK[@]}" layer "$S" "$PAUSE_LAYER" >/dev/null; rm -rf "$S"
fi

# --- app: podsnap from the working tree, as an overlay diff on top of the base ----------------------------
SRC_FILES=$(cd "$REPO_ROOT" && git ls-files -co --exclude-standard python README.md | grep -v -e '__pycache__' -e '\.egg-info/' | sort)
APP_KEY=$( (echo "$BASE_KEY"; cd "$REPO_ROOT" && echo "$SRC_FILES" | while read -r f; do [ -f "$f" ] && sha256sum "$f"; done) | sha)
APP_LAYER=$IMAGES_CACHE/app-$APP_KEY.tar
if [ ! -f "$APP_LAYER.sha256" ]; then
  W=$(mktemp -d "$IMAGES_CACHE/app-build.XXXXXX"); mkdir -p "$W/upper" "$W/work" "$W/merged"
  cleanup_app() { umount "$W/merged/dev" "$W/merged/proc" 2>/dev/null || true; umount "$W/merged" 2>/dev/null || true; rm -rf "$W"; }
  trap cleanup_app EXIT
  mount -t overlay overlay -o "lowerdir=$BASE/rootfs,upperdir=$W/upper,workdir=$W/work" "$W/merged"
  # the operator runs as 65532 (unprivileged); Python's getpass (kopf's identity) needs it named
  grep -q '^podsnap:' "$W/merged/etc/passwd" || {
    echo 'podsnap:x:65532:65532:podsnap:/nonexistent:/usr/sbin/nologin' >>"$W/merged/etc/passwd"
    echo 'podsnap:x:65532:' >>"$W/merged/etc/group"
  }
  mkdir -p "$W/merged/tmp/podsnap-src"
  (cd "$REPO_ROOT" && echo "$SRC_FILES" | while read -r f; do [ -f "$f" ] && echo "$f"; done | tar -cf - -T -) | tar -xf - -C "$W/merged/tmp/podsnap-src"
  # setuptools refuses a readme outside the project dir (pyproject's "../README.md"): bring it inside
  if grep -q '^readme = "../README.md"' "$W/merged/tmp/podsnap-src/python/pyproject.toml"; then
    cp "$W/merged/tmp/podsnap-src/README.md" "$W/merged/tmp/podsnap-src/python/README.md" 2>/dev/null || : >"$W/merged/tmp/podsnap-src/python/README.md"
    sed -i 's#^readme = "../README.md"#readme = "README.md"#' "$W/merged/tmp/podsnap-src/python/pyproject.toml"
  fi
  chroot_run "$W/merged" pip install -q --no-cache-dir --no-index --no-deps --no-build-isolation /tmp/podsnap-src/python \
    >"$W/pip.log" 2>&1 || { tail -30 "$W/pip.log" >&2; die "pip install of podsnap from the working tree into the image failed"; }
  rm -rf "$W/merged/tmp/podsnap-src"
  umount "$W/merged"
  rm -rf "$W/upper/tmp" "$W/upper/root"   # only pip's scratch; /tmp and /root exist in the base
  "${MK[@]}" layer "$W/upper" "$APP_LAYER" >/dev/null
  cleanup_app; trap - EXIT
  for old in "$IMAGES_CACHE"/app-*.tar; do [ "$old" = "$APP_LAYER" ] || rm -f "$old" "$old.sha256"; done
fi

# --- the archive ----------------------------------------------------------------------------------------
VENV_PATH=PATH=/opt/podsnap/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
SPEC=$(cat <<JSON
{"images": [
 {"ref": "localhost/podsnap-operator:$IMAGE_TAG", "layers": ["$BASE/layer.tar", "$APP_LAYER"],
  "config": {"Entrypoint": ["podsnap-operator"], "Env": ["$VENV_PATH", "PYTHONUNBUFFERED=1"], "User": "65532:65532"}},
 {"ref": "localhost/podsnap-agent:$IMAGE_TAG", "layers": ["$BASE/layer.tar", "$CRIU_LAYER", "$APP_LAYER"],
  "config": {"Entrypoint": ["podsnap-agent"], "Env": ["$VENV_PATH", "PYTHONUNBUFFERED=1", "PODSNAP_CRIU=/opt/podsnap/criu/criu"]}},
 {"ref": "localhost/podsnap-demo:$IMAGE_TAG", "layers": ["$BASE/layer.tar", "$APP_LAYER"],
  "config": {"Cmd": ["python", "-m", "podsnap.demo"], "Env": ["$VENV_PATH", "PYTHONUNBUFFERED=1"], "ExposedPorts": {"8000/tcp": {}}}},
 {"ref": "localhost/pause:$IMAGE_TAG", "layers": ["$PAUSE_LAYER"], "config": {"Entrypoint": ["/pause"]}}
]}
JSON
)
KEY=$( (echo "$SPEC"; cat "$BASE/layer.tar.sha256" "$CRIU_LAYER.sha256" "$APP_LAYER.sha256" "$PAUSE_LAYER.sha256") | sha256sum | cut -c1-64)
if [ "$(cat "$IMAGES_ARCHIVE.sha256" 2>/dev/null)" != "$KEY" ] || [ ! -f "$IMAGES_ARCHIVE" ]; then
  echo "$SPEC" >"$IMAGES_CACHE/spec.json"
  "${MK[@]}" archive "$IMAGES_CACHE/spec.json" "$IMAGES_ARCHIVE" >/dev/null
  echo "$KEY" >"$IMAGES_ARCHIVE.sha256"
  clog "images written in $(( $(date +%s) - T0 )) s: $IMAGES_ARCHIVE ($(du -h "$IMAGES_ARCHIVE" | cut -f1))"
fi
echo "$IMAGES_ARCHIVE"
