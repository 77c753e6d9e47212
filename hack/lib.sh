# Shared helpers for podsnap's setup scripts. Sourced, not run.
# Slow builds live in a per-user cache keyed by version, so a fresh clone and CI on the same
# machine reuse them; a fresh machine rebuilds them.
PODSNAP_CACHE=${PODSNAP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/podsnap}
export PODSNAP_CACHE
log() { printf '[setup] %s\n' "$*" >&2; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }
# debian_mirror: the mirror this machine's apt already uses
debian_mirror() {
  local m=""
  [ -f /etc/apt/sources.list.d/debian.sources ] && m=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources)
  [ -z "$m" ] && [ -f /etc/apt/sources.list ] && m=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list)
  echo "${m:-http://deb.debian.org/debian}"
}
# apt_install PKG...: install Debian packages only when missing (idempotent, quiet)
apt_install() {
  local missing=()
  for p in "$@"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "apt-get install ${missing[*]}"
  if ! apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1; then
    apt-get -o DPkg::Lock::Timeout=600 update >/dev/null 2>&1 || true
    apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends "${missing[@]}" >/dev/null \
      || die "apt-get install ${missing[*]} failed"
  fi
}
# private_apt_src SUITE WORKDIR: a deb-src list for SUITE kept outside the system's apt state
private_apt_src() {
  local suite=$1 w=$2
  mkdir -p "$w/apt/lists/partial" "$w/apt/cache/archives/partial"
  echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $(debian_mirror) $suite main" >"$w/apt/src.list"
  APTO=(-o Dir::Etc::SourceList="$w/apt/src.list" -o Dir::Etc::SourceParts=/dev/null
        -o Dir::State::Lists="$w/apt/lists" -o Dir::Cache="$w/apt/cache")
  apt-get "${APTO[@]}" update >/dev/null 2>&1 || die "apt-get update for deb-src $suite failed (is the Debian mirror reachable?)"
}
