#!/usr/bin/env bash
# Caches the Python sources of the inference engines podsnap's adapters are checked against, for
# the contract tests (tests/engines, marker `engines`). Wheels come from PyPI with pip, are checked
# against pinned sha256 digests, and only their .py files are kept: nothing is installed or imported.
#   $PODSNAP_CACHE/engines-<versions>/<package>/...   then a .complete stamp
# TensorRT-LLM is not here: PyPI has only a stub sdist of it (see docs/engines.md).
# Idempotent: a second run is a stamp check. PODSNAP_NO_ENGINES=1 skips it (the tests then skip).
# usage: hack/engines.sh [--print-dir]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
source "$ROOT/hack/lib.sh"
PY=${PODSNAP_VENV_PYTHON:-$ROOT/.venv/bin/python}

# package==version  sha256 of the wheel for CPython 3.12, manylinux x86_64 (what engine images run)
PINS=(
  "vllm==0.33.0 4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa"
  "sglang==0.5.23 8d257a319395b322bb1be327d05e5528859358153c8563b04c0a4a3c8af164b6"
)
KEY=$(for p in "${PINS[@]}"; do echo "${p%% *}"; done | tr '=' '-' | sed 's/--/-/' | paste -sd_)
DIR=$PODSNAP_CACHE/engines-$KEY
if [ "${1:-}" = "--print-dir" ]; then echo "$DIR"; exit 0; fi
if [ "${PODSNAP_NO_ENGINES:-0}" = 1 ]; then log "engines: skipped (PODSNAP_NO_ENGINES=1); tests marked engines will skip"; exit 0; fi
[ -f "$DIR/.complete" ] && exit 0

T0=$(date +%s)
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
for pin in "${PINS[@]}"; do
  spec=${pin%% *}; sha=${pin##* }; name=${spec%%==*}
  log "engines: pip download $spec (wheel for cp312 manylinux x86_64)"
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --abi cp312 --abi abi3 --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 \
      -d "$TMP/$name" "$spec" >/dev/null 2>&1 \
    || die "engines: pip download $spec failed (PyPI reachable?); PODSNAP_NO_ENGINES=1 skips the engine contract tests"
  whl=$(ls "$TMP/$name"/*.whl)
  echo "$sha  $whl" | sha256sum -c --quiet - || die "engines: sha256 mismatch for $(basename "$whl")"
  # only the package's own .py files: no shared objects, nothing that could run
  "$PY" - "$whl" "$name" "$TMP/src" <<'EOF'
import sys, zipfile
from pathlib import Path
whl, name, dest = sys.argv[1], sys.argv[2], Path(sys.argv[3])
with zipfile.ZipFile(whl) as z:
    members = [m for m in z.namelist() if m.startswith(f"{name}/") and m.endswith(".py")]
    for m in members:
        target = dest / m
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(z.read(m))
print(f"{name}: {len(members)} .py files", file=sys.stderr)
EOF
  echo "$spec $sha $(basename "$whl")" >>"$TMP/src/.versions"
done
rm -rf "$DIR.tmp" "$DIR"; mv "$TMP/src" "$DIR.tmp"; date -u +%FT%TZ >"$DIR.tmp/.complete"; mv "$DIR.tmp" "$DIR"
log "engines: sources cached in $DIR in $(( $(date +%s) - T0 )) s"
