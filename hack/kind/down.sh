#!/usr/bin/env bash
# Deletes the kind cluster made by hack/kind/up.sh (images stay in Docker).
# usage: hack/kind/down.sh        env: KIND_CLUSTER (podsnap)
set -euo pipefail
source "$(dirname "$0")/../lib.sh"
NAME=${KIND_CLUSTER:-podsnap}
command -v kind >/dev/null || die "kind not found: nothing to delete"
kind delete cluster --name "$NAME"
rm -f "$PODSNAP_CACHE/kind/$NAME.kubeconfig"
