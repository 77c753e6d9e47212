#!/usr/bin/env bash
# kind with GPU passthrough: the same podsnap images and e2e flow as the local cluster, on real GPUs.
# Needs, on this host: Docker, the NVIDIA container toolkit (default runtime, volume-mount device
# selection on: see kind-gpu.yaml), an NVIDIA GPU, `kind`, and network for `docker build`.
# Creates the cluster from hack/kind/kind-gpu.yaml, installs the NVIDIA container runtime into the node,
# builds the images from images/*/Dockerfile, loads them with `kind load docker-image`, installs the
# NVIDIA device plugin when its Helm chart is available, and prints how to run the e2e suite.
# usage: hack/kind/up.sh        env: KIND_CLUSTER (podsnap), PODSNAP_KIND_SKIP_BUILD=1 (reuse images)
set -euo pipefail
D=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$D/../.." && pwd)
source "$ROOT/hack/lib.sh"
NAME=${KIND_CLUSTER:-podsnap}
KCFG=$PODSNAP_CACHE/kind/$NAME.kubeconfig
TAG=dev
for t in docker kind; do command -v "$t" >/dev/null || die "$t not found: hack/kind needs Docker and kind (https://kind.sigs.k8s.io)"; done
docker info >/dev/null 2>&1 || die "the Docker daemon is not reachable: start it (this script cannot run without Docker)"
docker info --format '{{json .Runtimes}}' | grep -q nvidia \
  || die "Docker has no 'nvidia' runtime: install the NVIDIA container toolkit and run 'nvidia-ctk runtime configure --runtime=docker --set-as-default'"
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null || die "no NVIDIA GPU visible on this host (nvidia-smi -L failed)"
T0=$(date +%s); step() { log "$(( $(date +%s) - T0 ))s $*"; }

# --- images: exactly images/*/Dockerfile, built from a context of only what they copy --------------------
if [ "${PODSNAP_KIND_SKIP_BUILD:-0}" != 1 ]; then
  CTX=$(mktemp -d); trap 'rm -rf "$CTX"' EXIT
  (cd "$ROOT" && git ls-files -co --exclude-standard README.md python hack/lib.sh hack/build-criu.sh hack/criu-guards.c images \
     | grep -v -e __pycache__ -e '\.egg-info/' | tar -cf - -T -) | tar -xf - -C "$CTX"
  docker build -q -f "$CTX/images/operator/Dockerfile" -t "localhost/podsnap-operator:$TAG" "$CTX" >/dev/null
  docker build -q -f "$CTX/images/agent/Dockerfile" -t "localhost/podsnap-agent:$TAG" "$CTX" >/dev/null
  docker build -q -f "$CTX/images/agent/Dockerfile" --build-arg PODSNAP_EXTRAS=gpu \
    -t "localhost/podsnap-agent-gpu:$TAG" "$CTX" >/dev/null
  docker build -q -f "$CTX/images/demo/Dockerfile" -t "localhost/podsnap-demo:$TAG" "$CTX" >/dev/null
  docker build -q -f "$CTX/images/demo/Dockerfile" --build-arg PODSNAP_EXTRAS=gpu,torch \
    -t "localhost/podsnap-demo-gpu:$TAG" "$CTX" >/dev/null
  step "images built"
fi

# --- cluster ------------------------------------------------------------------------------------------
mkdir -p "$(dirname "$KCFG")"
if ! kind get clusters 2>/dev/null | grep -qx "$NAME"; then
  kind create cluster --name "$NAME" --config "$D/kind-gpu.yaml" --kubeconfig "$KCFG" --wait 120s
fi
kind get kubeconfig --name "$NAME" >"$KCFG"
NODES=$(kind get nodes --name "$NAME")
step "cluster $NAME up"
# the NVIDIA container runtime inside each node (what the containerd patch in kind-gpu.yaml names)
for n in $NODES; do
  if ! docker exec "$n" test -x /usr/bin/nvidia-container-runtime; then
    docker exec "$n" bash -c '
      set -e; apt-get update -qq && apt-get install -y -qq curl gpg >/dev/null
      curl -fsSL https://nvidia.github.io/libnvidia-container/gpgkey | gpg --dearmor -o /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg
      curl -fsSL https://nvidia.github.io/libnvidia-container/stable/deb/nvidia-container-toolkit.list \
        | sed "s#deb https://#deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] https://#" \
        > /etc/apt/sources.list.d/nvidia-container-toolkit.list
      apt-get update -qq && apt-get install -y -qq nvidia-container-toolkit >/dev/null'
    docker exec "$n" systemctl restart containerd
  fi
  # the node label the local cluster's kubelet also carries (the chart's values may select on it)
  kubectl --kubeconfig "$KCFG" label node "$n" podsnap.io/local-cluster=true --overwrite >/dev/null
done
step "NVIDIA runtime in the node(s)"
for img in operator agent agent-gpu demo demo-gpu; do kind load docker-image --name "$NAME" "localhost/podsnap-$img:$TAG" >/dev/null; done
step "images loaded"

# --- NVIDIA device plugin: only when the user has its chart (nothing is fetched behind their back) -----------
if helm search repo nvdp/nvidia-device-plugin 2>/dev/null | grep -q nvidia-device-plugin; then
  helm --kubeconfig "$KCFG" upgrade --install nvdp nvdp/nvidia-device-plugin -n nvidia-device-plugin --create-namespace --wait
  step "NVIDIA device plugin installed"
elif [ -n "${NVIDIA_DEVICE_PLUGIN_MANIFEST:-}" ]; then
  kubectl --kubeconfig "$KCFG" apply -f "$NVIDIA_DEVICE_PLUGIN_MANIFEST"
  step "NVIDIA device plugin applied from $NVIDIA_DEVICE_PLUGIN_MANIFEST"
else
  log "NVIDIA device plugin not installed: add its Helm repo (helm repo add nvdp https://nvidia.github.io/k8s-device-plugin) or set NVIDIA_DEVICE_PLUGIN_MANIFEST, then rerun"
fi
VALUES=hack/kind/values-gpu.yaml
cat <<MSG
kind cluster '$NAME' ready. KUBECONFIG=$KCFG
Run the e2e flow on it (GPU demo worker):
  .venv/bin/python -m pytest -m cluster tests/e2e --kubeconfig $KCFG \\
    --app-config-file-path $VALUES --e2e-worker gpu --cluster-type kind-gpu
MSG
