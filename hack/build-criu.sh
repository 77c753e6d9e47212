#!/usr/bin/env bash
# Builds CRIU from Debian's newer source package on a Debian 12 machine, into the per-user cache.
# Debian 12's own criu 3.17 fails on these kernels ("vdso: Unexpected rt vDSO area bounds") and has
# no CUDA plugin support; 4.2.1 works. The result travels (to the GPU machine, into pods) with lib/.
# usage: hack/build-criu.sh            -> prints the bundle dir ($PODSNAP_CACHE/criu-$VERSION)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
CRIU_VERSION=${CRIU_VERSION:-4.2.1}
CRIU_DEB_VERSION=${CRIU_DEB_VERSION:-4.2.1-1}
CRIU_ORIG_SHA256=${CRIU_ORIG_SHA256:-29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9}
OUT=$PODSNAP_CACHE/criu-$CRIU_VERSION
if [ -x "$OUT/criu" ] && LD_LIBRARY_PATH="$OUT/lib" "$OUT/criu" --version >/dev/null 2>&1; then echo "$OUT"; exit 0; fi
log "building CRIU $CRIU_VERSION (≈1 min) into $OUT"
apt_install build-essential pkgconf libbsd-dev libcap-dev libgnutls28-dev libnet1-dev libnftables-dev \
  libnl-3-dev libprotobuf-c-dev libprotobuf-dev protobuf-c-compiler protobuf-compiler python3-protobuf \
  uuid-dev iproute2 xz-utils
WORK=$(mktemp -d "${TMPDIR:-/tmp}/podsnap-criu.XXXXXX"); trap 'rm -rf "$WORK"' EXIT
TARBALL=""
for suite in sid forky trixie; do
  private_apt_src "$suite" "$WORK/$suite"
  (cd "$WORK" && apt-get "${APTO[@]}" source --download-only "criu=$CRIU_DEB_VERSION" >/dev/null 2>&1) || true
  TARBALL=$(ls "$WORK"/criu_"$CRIU_VERSION".orig.tar.* 2>/dev/null | head -1 || true)
  [ -n "$TARBALL" ] && break
done
[ -n "$TARBALL" ] || die "CRIU: source criu=$CRIU_DEB_VERSION is in none of Debian sid/forky/trixie any more; set CRIU_DEB_VERSION/CRIU_VERSION/CRIU_ORIG_SHA256 to the version Debian has"
echo "$CRIU_ORIG_SHA256  $TARBALL" | sha256sum -c --quiet - || die "CRIU: sha256 of $TARBALL does not match the pinned $CRIU_ORIG_SHA256"
tar -C "$WORK" -xf "$TARBALL"
SRC=$(ls -d "$WORK"/criu-"$CRIU_VERSION"*/ | head -1)
make -C "$SRC" -j"$(nproc)" criu >"$WORK/make.log" 2>&1 || { tail -30 "$WORK/make.log" >&2; die "CRIU: make failed (log above)"; }
STAGE=$OUT.tmp.$$; rm -rf "$STAGE"; mkdir -p "$STAGE/lib"
cp "$SRC/criu/criu" "$STAGE/criu"
# every shared library beyond glibc, so the bundle runs elsewhere with LD_LIBRARY_PATH=lib (glibc >= 2.36 needed)
ldd "$STAGE/criu" | awk '/=> \//{print $3}' | grep -Ev '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*)[.-]' \
  | xargs -r -I{} cp -L {} "$STAGE/lib/"
cat >"$STAGE/criu.sh" <<'SH'
#!/bin/sh
# runs the bundled criu with its own libraries
D=$(dirname "$(readlink -f "$0")")
LD_LIBRARY_PATH="$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$D/criu" "$@"
SH
chmod +x "$STAGE/criu.sh"
LD_LIBRARY_PATH="$STAGE/lib" "$STAGE/criu" --version >&2
rm -rf "$OUT"; mv "$STAGE" "$OUT"
echo "$OUT"
