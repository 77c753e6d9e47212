#!/usr/bin/env bash
# Builds a statically linked CRIU from Debian's source package into the per-user cache.
# Debian 12's own criu 3.17 fails on these kernels ("vdso: Unexpected rt vDSO area bounds") and has no
# CUDA support; 4.2.1 works.
#
# Why static, and why guarded: the agent runs CRIU inside a workload container's mount namespace, as
# root with every capability. A dynamic CRIU would be loaded by the container's ELF interpreter, libc
# and /etc/ld.so.preload. So the binary has no PT_INTERP and no shared libraries, and it is linked with
# hack/criu-guards.c in place of every way CRIU could execute a program (sh, iptables, ip, tar,
# apparmor_parser, action scripts) or load code (plugins, NSS modules). Its two default paths into the
# container's filesystem, the kerndat cache (/run/criu.kdat) and the plugin dir (/usr/lib/criu), point
# into /proc, where nobody can create files. The checks at the end prove each property on the result.
# gnutls (TLS page server) and nftables (network locking) have no static archives in Debian and are
# left out; podsnap needs neither (CRIU is told `network-lock skip`, and connections are closed).
#
# usage: hack/build-criu.sh    -> prints the bundle dir ($PODSNAP_CACHE/criu-$VERSION-static):
#   criu       the static ELF (run it directly; the agent execs it through an fd of this file)
#   criu.sh    `exec criu "$@"`, for callers that carried the old bundle layout (.device/criu/criu.sh)
#   BUILDINFO  version, source digest, recipe digest, build time
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/lib.sh"
CRIU_VERSION=${CRIU_VERSION:-4.2.1}
CRIU_DEB_VERSION=${CRIU_DEB_VERSION:-4.2.1-1}
CRIU_ORIG_SHA256=${CRIU_ORIG_SHA256:-29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9}
OUT=$PODSNAP_CACHE/criu-$CRIU_VERSION-static
# a change to this script or to the guards rebuilds, so a cache never holds an older recipe's binary
RECIPE=$(cat "$HERE/build-criu.sh" "$HERE/criu-guards.c" "$HERE/criu-confine.c" | sha256sum | cut -c1-16)
if [ -x "$OUT/criu" ] && grep -qx "recipe=$RECIPE" "$OUT/BUILDINFO" 2>/dev/null && "$OUT/criu" --version >/dev/null 2>&1; then
  echo "$OUT"; exit 0
fi
T0=$(date +%s)
log "building static CRIU $CRIU_VERSION (≈3 min on 2 cores) into $OUT"
apt_install build-essential pkgconf binutils libbsd-dev libcap-dev libnet1-dev libnl-3-dev libprotobuf-c-dev \
  libprotobuf-dev protobuf-c-compiler protobuf-compiler python3-protobuf uuid-dev xz-utils
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

# Optional libraries CRIU's Makefile.config picks up through pkg-config when installed: none has a
# static archive in Debian 12, so they are hidden whatever this machine has installed.
cat >"$WORK/pkg-config" <<'SH'
#!/bin/sh
for a in "$@"; do case $a in *nftables*|*gnutls*|*selinux*|*libbpf*|*libdrm*) exit 1;; esac; done
exec pkg-config "$@"
SH
chmod +x "$WORK/pkg-config"
gcc -O2 -Wall -Wextra -Werror -c "$HERE/criu-guards.c" -o "$WORK/criu-guards.o"
gcc -O2 -Wall -Wextra -Werror -c "$HERE/criu-confine.c" -o "$WORK/criu-confine.o"
GUARDED=execvp,execvpe,execve,execlp,dlopen,dlerror,dlsym,dlclose,getaddrinfo,freeaddrinfo,getnameinfo
GUARDED=$GUARDED,gethostbyname,gethostbyname2,gethostbyaddr,getprotobyname,getprotobynumber
# hack/criu-confine.c: every libc call CRIU resolves a path with, resolved inside the container's root
CONFINED=open64,openat64,creat64,fopen64,tmpfile64,opendir,scandir64,nftw64,ftw64,fstatat64,stat64,statfs64
CONFINED=$CONFINED,faccessat,access,readlinkat,readlink,chdir,chroot,mkdirat,mkdir,mknod,symlinkat,symlink
CONFINED=$CONFINED,unlinkat,unlink,rmdir,remove,lutimes,renameat,rename,linkat,fchmodat,chmod,fchownat
CONFINED=$CONFINED,inotify_add_watch,fanotify_mark,mount,umount2,umount,pivot_root,mkdtemp,bind,connect
# path-taking libc functions: CRIU may call only those confined above (checked on its objects below)
PATHCALLS="open open64 openat openat64 __open_2 __open64_2 __openat_2 __openat64_2 creat creat64 fopen fopen64
  freopen freopen64 opendir scandir scandir64 scandirat nftw nftw64 ftw ftw64 stat stat64 lstat lstat64 fstatat
  fstatat64 __xstat __xstat64 __lxstat __lxstat64 __fxstatat __fxstatat64 statx statfs statfs64 statvfs statvfs64
  access faccessat euidaccess eaccess readlink readlinkat chdir chroot mkdir mkdirat mknod mknodat mkfifo mkfifoat
  symlink symlinkat link linkat unlink unlinkat rmdir remove rename renameat renameat2 chmod fchmodat chown lchown
  fchownat truncate truncate64 utime utimes lutimes utimensat futimesat inotify_add_watch fanotify_mark mount umount
  umount2 pivot_root mkdtemp mkstemp mkstemp64 mkostemp mkostemp64 tmpfile tmpfile64 bind connect sendto realpath
  name_to_handle_at getxattr setxattr lgetxattr lsetxattr listxattr llistxattr removexattr lremovexattr"
# WRAPFLAGS reaches only the final links (criu, and compel's host tool, which runs at build time);
# LDFLAGS would also reach the relocatable links of CRIU's parasite and restorer blobs, which must
# stay position independent. gcc's -static applies wherever it sits on the line.
WRAPPED=$GUARDED,$CONFINED
WRAP="-static $WORK/criu-guards.o $WORK/criu-confine.o -Wl,--wrap=${WRAPPED//,/,--wrap=}"
if ! WRAPFLAGS="$WRAP" make -C "$SRC" -j"$(nproc)" criu PKG_CONFIG="$WORK/pkg-config" NO_GNUTLS=1 \
    RUNDIR=/proc/self/podsnap-no-kdat-cache PLUGINDIR=/proc/self/podsnap-no-criu-plugins >"$WORK/make.log" 2>&1; then
  tail -30 "$WORK/make.log" >&2; die "CRIU: make failed (log above)"
fi
BIN=$SRC/criu/criu

# --- what the result must be ----------------------------------------------------------------------
readelf -lW "$BIN" | grep -q 'Requesting program interpreter' && die "CRIU: the binary has an ELF interpreter (not static)"
readelf -dW "$BIN" | grep -q NEEDED && die "CRIU: the binary needs shared libraries (not static)"
grep -i 'warning: Using .* in statically linked' "$WORK/make.log" >&2 && die "CRIU: the link kept glibc calls that load shared objects at run time (above): guard them in hack/criu-guards.c"
SYMS=$(nm "$BIN")
for s in ${WRAPPED//,/ }; do
  grep -q " T __wrap_$s\$" <<<"$SYMS" || die "CRIU: the guard for $s is not linked in"
done
# every path-taking libc function CRIU's own objects call must be one the confinement wraps: a CRIU
# version that starts calling another one fails here instead of resolving a workload's path unconfined
CALLED=$(nm -u "$SRC"/criu/built-in.o "$SRC"/compel/libcompel.a "$SRC"/soccr/libsoccr.a | awk 'NF==2 {print $2}' | sort -u) \
  || die "CRIU: cannot list the libc functions its objects call (nm)"
for f in $PATHCALLS; do
  grep -qx "$f" <<<"$CALLED" || continue
  grep -qx "$f" <<<"${CONFINED//,/$'\n'}" || die "CRIU calls $f, which hack/criu-confine.c does not confine: wrap it there"
done
# program execution and NSS code must be absent altogether; glibc's static dlopen stays linked
# (reached from backtrace_symbols and gconv), but no CRIU code calls it: every call is wrapped above
BAD=$(grep -E ' [TtWw] (execve|__execve|execvp|execvpe|execlp|execl|execv|execle|fexecve|posix_spawnp?|system|popen|__nss_lookup|__nss_module_load|getaddrinfo|gethostbyname_r)$' <<<"$SYMS" || true)
[ -z "$BAD" ] || die "CRIU: the binary still contains code to run programs or load NSS modules: $(echo $BAD)"
grep -q 'podsnap-no-kdat-cache' "$BIN" && grep -q 'podsnap-no-criu-plugins' "$BIN" \
  || die "CRIU: RUNDIR/PLUGINDIR did not reach the build"
strip "$BIN"
"$BIN" --version >/dev/null || die "CRIU: the built binary does not run"

STAGE=$OUT.tmp.$$; rm -rf "$STAGE"; mkdir -p "$STAGE"
cp "$BIN" "$STAGE/criu"
cat >"$STAGE/criu.sh" <<'SH'
#!/bin/sh
# the bundle's criu is static: this only keeps the old entry point (criu.sh) working
exec "$(dirname "$(readlink -f "$0")")/criu" "$@"
SH
chmod +x "$STAGE/criu.sh"
{
  echo "version=$CRIU_VERSION"
  echo "source=$(basename "$TARBALL") sha256=$CRIU_ORIG_SHA256"
  echo "recipe=$RECIPE"
  echo "static=yes guards=$GUARDED confined=$CONFINED"
  echo "built=$(date -u +%FT%TZ) seconds=$(( $(date +%s) - T0 )) size=$(stat -c %s "$STAGE/criu")"
} >"$STAGE/BUILDINFO"
"$STAGE/criu" --version >&2
rm -rf "$OUT"; mv "$STAGE" "$OUT"
log "static CRIU built in $(( $(date +%s) - T0 )) s ($(stat -c %s "$OUT/criu") bytes)"
echo "$OUT"
