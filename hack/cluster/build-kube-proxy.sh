#!/usr/bin/env bash
# Builds kube-proxy 1.20.2 (iptables mode: Services, ClusterIPs, the in-cluster `kubernetes` Service)
# from the same Debian 12 source package as hack/build-kubernetes.sh, into the per-user cache.
# Skipped when hack/build-kubernetes.sh already produced one. ≈3 min cold on 2 cores, cached after.
# usage: hack/cluster/build-kube-proxy.sh    -> prints the kube-proxy path
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
K8S_VERSION=1.20.2
K8S_DEB_VERSION=${K8S_DEB_VERSION:-1.20.5+really1.20.2-1.1+deb12u1}
K8S_ORIG_SHA256=${K8S_ORIG_SHA256:-b83c0780efb182d928dc63d46488a847f161f04e40a94b96bf5247dd671ecdfc}
for b in "$PODSNAP_CACHE/kubernetes-$K8S_VERSION/bin/kube-proxy" "$PODSNAP_CACHE/kube-proxy-$K8S_VERSION/bin/kube-proxy"; do
  [ -x "$b" ] && { echo "$b"; exit 0; }
done
OUT=$PODSNAP_CACHE/kube-proxy-$K8S_VERSION
log "building kube-proxy $K8S_VERSION from Debian source (≈3 min, once per machine)"
apt_install golang-go golang-github-modern-go-reflect2-dev ca-certificates
WORK=$OUT.work   # kept across failures: Go's build cache makes a retry fast
mkdir -p "$WORK"
TARBALL=$WORK/kubernetes_1.20.5+really1.20.2.orig.tar.gz
if ! echo "$K8S_ORIG_SHA256  $TARBALL" | sha256sum -c --quiet - >/dev/null 2>&1; then
  private_apt_src bookworm "$WORK"
  (cd "$WORK" && apt-get "${APTO[@]}" source --download-only "kubernetes=$K8S_DEB_VERSION" >/dev/null 2>&1) || true
  [ -f "$TARBALL" ] || die "kube-proxy: could not download source kubernetes=$K8S_DEB_VERSION from Debian bookworm"
  echo "$K8S_ORIG_SHA256  $TARBALL" | sha256sum -c --quiet - || die "kube-proxy: sha256 of $TARBALL does not match the pinned $K8S_ORIG_SHA256"
fi
SRC=$WORK/src/kubernetes-$K8S_VERSION
if [ ! -f "$SRC/.podsnap-prepared" ]; then
  rm -rf "$WORK/src"; mkdir -p "$WORK/src"; tar -C "$WORK/src" -xzf "$TARBALL"
  d=$(ls -d "$WORK"/src/kubernetes-1.*/ | head -1); d=${d%/}
  [ "$d" = "$SRC" ] || mv "$d" "$SRC"
  # same fix as hack/build-kubernetes.sh: the vendored reflect2 1.0.1 faults under Go >= 1.18
  R=$SRC/vendor/github.com/modern-go/reflect2
  find "$R" -maxdepth 1 \( -name '*.go' -o -name '*.s' \) -delete
  cp /usr/share/gocode/src/github.com/modern-go/reflect2/*.go /usr/share/gocode/src/github.com/modern-go/reflect2/*.s "$R/"
  touch "$SRC/.podsnap-prepared"
fi
# Kubernetes 1.20 builds in GOPATH mode with its vendor/ tree (what its own make does)
export CGO_ENABLED=0 GOPATH=$WORK/gopath GOCACHE=$WORK/gocache HOME=$WORK/home GO111MODULE=off GOFLAGS=
mkdir -p "$GOPATH/src/k8s.io" "$HOME"; ln -sfn "$SRC" "$GOPATH/src/k8s.io/kubernetes"
cd "$GOPATH/src/k8s.io/kubernetes"
# kube-proxy needs none of make's generated files (those are for the apiserver's OpenAPI), so a plain
# go build is enough and skips make's slow code generation.
V=k8s.io/component-base/version
go build -o "$WORK/kube-proxy" -ldflags "-s -w -X $V.gitVersion=v$K8S_VERSION -X $V.gitMajor=1 -X $V.gitMinor=20" k8s.io/kubernetes/cmd/kube-proxy \
  >"$WORK/build.log" 2>&1 || { tail -30 "$WORK/build.log" >&2; die "kube-proxy: go build failed (log: $WORK/build.log)"; }
mkdir -p "$OUT/bin"; mv "$WORK/kube-proxy" "$OUT/bin/kube-proxy"
cd /; rm -rf "$WORK"
echo "$OUT/bin/kube-proxy"
