#!/usr/bin/env bash
# Builds Kubernetes 1.20.2 binaries (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet)
# from Debian 12's `kubernetes` source package with Debian's Go, into the per-user cache.
# No newer apiserver binary is reachable from this kind of machine (PyPI/npm/Debian only).
# Clean build ≈10 min on 2 cores, ≈2 GB of work space; cached afterwards.
# usage: hack/build-kubernetes.sh      -> prints the bin dir ($PODSNAP_CACHE/kubernetes-$VERSION/bin)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
K8S_VERSION=1.20.2
K8S_DEB_VERSION=${K8S_DEB_VERSION:-1.20.5+really1.20.2-1.1+deb12u1}
K8S_ORIG_SHA256=${K8S_ORIG_SHA256:-b83c0780efb182d928dc63d46488a847f161f04e40a94b96bf5247dd671ecdfc}
WHAT_BINS=(kube-apiserver kube-controller-manager kube-scheduler kubelet)
OUT=$PODSNAP_CACHE/kubernetes-$K8S_VERSION
ok=1; for b in "${WHAT_BINS[@]}"; do [ -x "$OUT/bin/$b" ] || ok=0; done
if [ $ok = 1 ]; then echo "$OUT/bin"; exit 0; fi
log "building Kubernetes $K8S_VERSION (${WHAT_BINS[*]}) from Debian source: ≈10 min, once per machine"
apt_install golang-go jq rsync golang-github-modern-go-reflect2-dev ca-certificates
WORK=$PODSNAP_CACHE/kubernetes-$K8S_VERSION.work   # kept across failures: Go's build cache makes a retry fast
mkdir -p "$WORK"
private_apt_src bookworm "$WORK"
TARBALL=$WORK/kubernetes_1.20.5+really1.20.2.orig.tar.gz
if ! echo "$K8S_ORIG_SHA256  $TARBALL" | sha256sum -c --quiet - >/dev/null 2>&1; then
  (cd "$WORK" && apt-get "${APTO[@]}" source --download-only "kubernetes=$K8S_DEB_VERSION" >/dev/null 2>&1) || true
  [ -f "$TARBALL" ] || die "Kubernetes: could not download source kubernetes=$K8S_DEB_VERSION from Debian bookworm"
  echo "$K8S_ORIG_SHA256  $TARBALL" | sha256sum -c --quiet - || die "Kubernetes: sha256 of $TARBALL does not match the pinned $K8S_ORIG_SHA256"
fi
SRC=$WORK/src/kubernetes-$K8S_VERSION
if [ ! -f "$SRC/.podsnap-prepared" ]; then
  rm -rf "$WORK/src"; mkdir -p "$WORK/src"; tar -C "$WORK/src" -xzf "$TARBALL"
  SRC=$(ls -d "$WORK"/src/kubernetes-1.*/ | head -1); SRC=${SRC%/}
  [ "$SRC" = "$WORK/src/kubernetes-$K8S_VERSION" ] || mv "$SRC" "$WORK/src/kubernetes-$K8S_VERSION"
  SRC=$WORK/src/kubernetes-$K8S_VERSION
  # Go >= 1.18 needs reflect2 >= 1.0.2; the vendored 1.0.1 crashes the apiserver ("fatal error: fault")
  # on the first custom resource. Debian ships a fixed reflect2 as a Go source package.
  R=$SRC/vendor/github.com/modern-go/reflect2
  find "$R" -maxdepth 1 \( -name '*.go' -o -name '*.s' \) -delete
  cp /usr/share/gocode/src/github.com/modern-go/reflect2/*.go /usr/share/gocode/src/github.com/modern-go/reflect2/*.s "$R/"
  touch "$SRC/.podsnap-prepared"
fi
export CGO_ENABLED=0 GOPATH=$WORK/gopath GOCACHE=$WORK/gocache HOME=$WORK/home GOFLAGS=-mod=vendor
mkdir -p "$GOPATH/src/k8s.io" "$HOME"; ln -sfn "$SRC" "$GOPATH/src/k8s.io/kubernetes"
cd "$GOPATH/src/k8s.io/kubernetes"
WHAT=""; for b in "${WHAT_BINS[@]}"; do WHAT="$WHAT cmd/$b"; done
make WHAT="${WHAT# }" >"$WORK/make.log" 2>&1 || { tail -40 "$WORK/make.log" >&2; die "Kubernetes: make failed (full log: $WORK/make.log)"; }
mkdir -p "$OUT/bin.tmp"
for b in "${WHAT_BINS[@]}"; do cp "_output/bin/$b" "$OUT/bin.tmp/"; done
rm -rf "$OUT/bin"; mv "$OUT/bin.tmp" "$OUT/bin"
# the source tree and Go cache are 2 GB; the binaries are all that is needed from now on
cd /; rm -rf "$WORK"
echo "$OUT/bin"
