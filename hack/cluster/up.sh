#!/usr/bin/env bash
# A real single-node Kubernetes 1.20 on this machine, no Docker: containerd + runc + CNI bridge
# (Debian), a distribution registry (Debian's docker-registry) on localhost:5000, etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy (iptables) and a kubelet, as
# plain background processes with pid files.
# podsnap's images take the user's path: built (hack/cluster/build-images.sh), exported and pushed by
# hack/images.sh (`make images`, `make images-push REGISTRY=localhost:5000/podsnap`), pulled by the
# kubelet; only the sandbox image (pause) is imported into containerd. Creates the default
# StorageClass + an RWX hostPath volume for the artifact PVC, prints the kubeconfig path and timings.
# Idempotent: a second run on a healthy cluster is a fast no-op, and only missing components are
# (re)started.
# usage: hack/cluster/up.sh [--no-images]
set -euo pipefail
source "$(dirname "$0")/common.sh"
WANT_IMAGES=1
for a in "$@"; do case $a in --no-images) WANT_IMAGES=0;; *) die "unknown option $a (usage: up.sh [--no-images])";; esac; done
need_root
T0=$(date +%s.%N)
step() { printf '[cluster] %6.1fs %s\n' "$(echo "$(date +%s.%N) - $T0" | bc)" "$*" >&2; }
mkdir -p "$CLUSTER_DIR" "$RUN" "$LOGS"
exec 9>"$CLUSTER_DIR/.lock"; flock 9   # one up/down at a time

api_ready() { [ -f "$KUBECONFIG_PATH" ] && kc get --raw /readyz >/dev/null 2>&1; }
node_ready() { kc get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null | grep -q True; }
all_alive() { local c; for c in "${COMPONENTS[@]}"; do pid_alive "$c" || return 1; done; }
registry_ready() { curl -fsS -o /dev/null "http://$REGISTRY_LISTEN/v2/" 2>/dev/null; }
# registry_has: the registry serves every podsnap image under $IMAGE_TAG (the storage can be wiped apart)
registry_has() {
  local n
  for n in "${IMAGE_NAMES[@]}"; do
    curl -fsS -o /dev/null -H 'Accept: application/vnd.docker.distribution.manifest.v2+json' \
      "http://$REGISTRY_LISTEN/v2/${REGISTRY#*/}/$n/manifests/$IMAGE_TAG" 2>/dev/null || return 1
  done
}
PAUSE_KEY=$(sha256sum <"$CLUSTER_SRC/pause.c" | cut -c1-16)
pause_current() { [ "$(cat "$CLUSTER_DIR/containerd/pause-imported" 2>/dev/null)" = "$PAUSE_KEY" ]; }
pushed_current() { [ -f "$IMAGES_ARCHIVE.sha256" ] && [ "$(cat "$REGISTRY_DIR/podsnap-pushed" 2>/dev/null)" = "$(cat "$IMAGES_ARCHIVE.sha256")" ] && registry_has; }
images_current() { [ $WANT_IMAGES = 0 ] || { pause_current && pushed_current; }; }

# --- images first: a fast no-op when nothing changed, a thin app layer when only podsnap changed ---
if [ $WANT_IMAGES = 1 ]; then "$CLUSTER_SRC/build-images.sh" >/dev/null; step "images built"; fi
if all_alive && api_ready && node_ready && images_current; then
  step "already up and healthy"; echo "KUBECONFIG=$KUBECONFIG_PATH"; exit 0
fi

# --- binaries and host packages ---------------------------------------------------------------
apt_install containerd runc containernetworking-plugins iptables conntrack bc openssl util-linux curl docker-registry skopeo
for b in kube-apiserver kube-controller-manager kube-scheduler kubelet; do
  kube_bin "$b" >/dev/null || die "$b missing: run hack/setup.sh (builds Kubernetes 1.20 into $PODSNAP_CACHE)"
done
KUBE_PROXY=$(kube_bin kube-proxy || "$CLUSTER_SRC/build-kube-proxy.sh")
ETCD=$(readlink -f "$REPO_ROOT/.tools/bin/etcd" 2>/dev/null || true)
[ -x "$ETCD" ] || die "etcd missing: run hack/setup.sh"
[ -x "$REPO_ROOT/.tools/bin/kubectl" ] || die "kubectl missing: run hack/setup.sh"

# --- network: private addresses only ------------------------------------------------------------
# kubelet refuses a loopback node IP and this kernel has no dummy links: the node address sits on an
# empty bridge we own.
ip link show kdummy0 >/dev/null 2>&1 || { ip link add kdummy0 type bridge; ip addr add "$NODE_IP/32" dev kdummy0; }
ip link set kdummy0 up
# Mount propagation into pods (HostToContainer/Bidirectional: the agent's view of /run) needs a
# shared root mount, as every systemd host has; systemd is not PID 1 here.
findmnt -no PROPAGATION / | grep -q shared || mount --make-rshared /
# Service traffic between pods on one bridge must pass iptables (kube-proxy's DNAT)
[ -f /proc/sys/net/bridge/bridge-nf-call-iptables ] && echo 1 >/proc/sys/net/bridge/bridge-nf-call-iptables
# The CNI bridge turns on forwarding; nothing from a pod may be forwarded off this machine: drop pod
# packets for anything that is not a pod, a Service or this host, before any NAT.
iptables -t mangle -N PODSNAP-NO-EGRESS 2>/dev/null || iptables -t mangle -F PODSNAP-NO-EGRESS
iptables -t mangle -A PODSNAP-NO-EGRESS -d "$POD_CIDR" -j RETURN
iptables -t mangle -A PODSNAP-NO-EGRESS -d "$SERVICE_CIDR" -j RETURN
iptables -t mangle -A PODSNAP-NO-EGRESS -m addrtype --dst-type LOCAL -j RETURN
iptables -t mangle -A PODSNAP-NO-EGRESS -j DROP
iptables -t mangle -C PREROUTING -i cni0 -j PODSNAP-NO-EGRESS 2>/dev/null || iptables -t mangle -I PREROUTING -i cni0 -j PODSNAP-NO-EGRESS
mkdir -p "$CLUSTER_DIR/cni/net.d" "$CLUSTER_DIR/etc" "$CLUSTER_DIR/volumes/artifacts"
sed "s#@CLUSTER_DIR@#$CLUSTER_DIR#g" "$CLUSTER_SRC/10-bridge.conflist" >"$CLUSTER_DIR/cni/net.d/10-bridge.conflist"
echo "nameserver 127.0.0.1" >"$CLUSTER_DIR/etc/resolv.conf"
step "network ready"

# --- containerd -------------------------------------------------------------------------------------
mkdir -p "$CLUSTER_DIR/etc/certs.d/$REGISTRY_HOST"
# the local registry speaks plain HTTP (containerd's registry hosts config, `config_path`)
printf 'server = "http://%s"\n[host."http://%s"]\n  capabilities = ["pull", "resolve"]\n' "$REGISTRY_HOST" "$REGISTRY_HOST" \
  >"$CLUSTER_DIR/etc/certs.d/$REGISTRY_HOST/hosts.toml"
sed "s#@CLUSTER_DIR@#$CLUSTER_DIR#g" "$CLUSTER_SRC/containerd-config.toml" >"$CLUSTER_DIR/etc/containerd.toml.new"
if pid_alive containerd && ! cmp -s "$CLUSTER_DIR/etc/containerd.toml.new" "$CLUSTER_DIR/etc/containerd.toml"; then
  # started with another configuration (e.g. before the registry existed): restart it; the pods'
  # containers run under their shims and stay
  pid=$(cat "$RUN/containerd.pid"); kill "$pid"
  for _ in $(seq 100); do pid_alive containerd || break; sleep 0.1; done
  pid_alive containerd && die "containerd (pid $pid) did not stop for its new configuration"
  step "containerd stopped (configuration changed)"
fi
mv "$CLUSTER_DIR/etc/containerd.toml.new" "$CLUSTER_DIR/etc/containerd.toml"
if ! pid_alive containerd; then
  # every registry but this machine's is unreachable on purpose: pulls from anywhere else go to a
  # proxy that is not there and fail at once; the local registry is reached directly
  start_bg containerd env HTTP_PROXY=http://127.0.0.1:9 HTTPS_PROXY=http://127.0.0.1:9 \
    NO_PROXY="localhost,127.0.0.1" no_proxy="localhost,127.0.0.1" containerd --config "$CLUSTER_DIR/etc/containerd.toml"
  for _ in $(seq 100); do ctr version >/dev/null 2>&1 && break; sleep 0.1; done
  ctr version >/dev/null 2>&1 || { tail -20 "$LOGS/containerd.log" >&2; die "containerd did not start (log: $LOGS/containerd.log)"; }
fi
step "containerd up"
if [ $WANT_IMAGES = 1 ] && ! pause_current; then
  # the sandbox image stays imported (containerd's sandbox_image): it is not podsnap's to ship
  T=$(mktemp -d); skopeo copy --quiet "docker-archive:$IMAGES_ARCHIVE:$PAUSE_IMAGE" "docker-archive:$T/pause.tar:$PAUSE_IMAGE" \
    && ctr -n k8s.io images import "$T/pause.tar" >/dev/null \
    || { rm -rf "$T"; die "importing $PAUSE_IMAGE from $IMAGES_ARCHIVE failed (log: $LOGS/containerd.log)"; }
  rm -rf "$T"; echo "$PAUSE_KEY" >"$CLUSTER_DIR/containerd/pause-imported"
  step "sandbox image imported: $PAUSE_IMAGE"
fi

# --- the registry, and podsnap's images in it --------------------------------------------------------
if ! pid_alive docker-registry; then
  mkdir -p "$REGISTRY_DIR"
  printf 'version: 0.1\nlog: {level: warn}\nstorage: {filesystem: {rootdirectory: %s}, delete: {enabled: true}}\nhttp: {addr: "%s"}\n' \
    "$REGISTRY_DIR" "$REGISTRY_LISTEN" >"$CLUSTER_DIR/etc/registry.yml"
  start_bg docker-registry docker-registry serve "$CLUSTER_DIR/etc/registry.yml"
  for _ in $(seq 100); do registry_ready && break; sleep 0.1; done
fi
registry_ready || { tail -20 "$LOGS/docker-registry.log" >&2; die "docker-registry not serving on $REGISTRY_LISTEN (log: $LOGS/docker-registry.log)"; }
step "registry up: $REGISTRY_HOST"
if [ $WANT_IMAGES = 1 ] && ! pushed_current; then
  # exactly `make images` + `make images-push REGISTRY=localhost:5000/podsnap`, into the cluster's own dir
  PODSNAP_IMAGES_DIR=$PUSH_DIR TAG=$IMAGE_TAG "$REPO_ROOT/hack/images.sh" export "$IMAGES_ARCHIVE"
  PODSNAP_IMAGES_DIR=$PUSH_DIR "$REPO_ROOT/hack/images.sh" push "$REGISTRY" >/dev/null
  cp "$IMAGES_ARCHIVE.sha256" "$REGISTRY_DIR/podsnap-pushed"
  # the tag is reused (dev), so the node's copies are stale now: drop them, and the kubelet pulls the
  # new ones (imagePullPolicy IfNotPresent) for the next pods
  for n in "${IMAGE_NAMES[@]}"; do
    ctr -n k8s.io images rm "$REGISTRY/$n:$IMAGE_TAG" >/dev/null 2>&1 || true
  done
  step "images pushed: $REGISTRY/{$(IFS=,; echo "${IMAGE_NAMES[*]}")}:$IMAGE_TAG"
fi

# --- PKI and kubeconfig (kept across restarts, so a kubeconfig handed out stays valid) -------------
if [ ! -f "$PKI/tokens.csv" ]; then
  rm -rf "$PKI.tmp"; mkdir -p "$PKI.tmp"; (
    cd "$PKI.tmp"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 -subj /CN=podsnap-local-ca 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj /CN=kube-apiserver 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,IP:%s,IP:%s,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\nextendedKeyUsage=serverAuth\n' \
      "$NODE_IP" "${SERVICE_CIDR%.0/24}.1" >ext.cnf
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out apiserver.crt -days 3650 -extfile ext.cnf 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null; openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    echo "$(openssl rand -hex 16),admin,admin,system:masters" >tokens.csv
  ); mv "$PKI.tmp" "$PKI"
fi
TOKEN=$(cut -d, -f1 "$PKI/tokens.csv")
cat >"$KUBECONFIG_PATH.tmp" <<KC
apiVersion: v1
kind: Config
clusters: [{name: podsnap-local, cluster: {server: "https://$NODE_IP:$API_PORT", certificate-authority-data: "$(base64 -w0 "$PKI/ca.crt")"}}]
users: [{name: admin, user: {token: "$TOKEN"}}]
contexts: [{name: podsnap-local, context: {cluster: podsnap-local, user: admin}}]
current-context: podsnap-local
KC
chmod 600 "$KUBECONFIG_PATH.tmp"; mv "$KUBECONFIG_PATH.tmp" "$KUBECONFIG_PATH"

# --- control plane ------------------------------------------------------------------------------------
if ! pid_alive etcd; then
  mkdir -p "$CLUSTER_DIR/etcd"
  start_bg etcd "$ETCD" --name podsnap --data-dir "$CLUSTER_DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "podsnap=http://127.0.0.1:$ETCD_PEER_PORT" --listen-metrics-urls "http://127.0.0.1:0"
fi
if ! pid_alive kube-apiserver; then
  start_bg kube-apiserver "$(kube_bin kube-apiserver)" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address "$NODE_IP" --advertise-address "$NODE_IP" --secure-port "$API_PORT" \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" --client-ca-file "$PKI/ca.crt" \
    --token-auth-file "$PKI/tokens.csv" --authorization-mode RBAC \
    --service-account-issuer https://kubernetes.default.svc --service-account-key-file "$PKI/sa.pub" \
    --service-account-signing-key-file "$PKI/sa.key" --service-cluster-ip-range "$SERVICE_CIDR" \
    --allow-privileged=true --kubelet-preferred-address-types InternalIP \
    --enable-aggregator-routing=true --profiling=false
fi
for _ in $(seq 600); do api_ready && break; sleep 0.1; done
api_ready || { tail -20 "$LOGS/kube-apiserver.log" >&2; die "kube-apiserver not ready (log: $LOGS/kube-apiserver.log)"; }
step "apiserver ready"

# --- controllers, proxy, kubelet ----------------------------------------------------------------------
KC=$KUBECONFIG_PATH
pid_alive kube-controller-manager || start_bg kube-controller-manager "$(kube_bin kube-controller-manager)" \
  --kubeconfig "$KC" --authentication-kubeconfig "$KC" --authorization-kubeconfig "$KC" \
  --bind-address 127.0.0.1 --secure-port 0 --port 0 --leader-elect=false \
  --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" --controllers '*'
pid_alive kube-scheduler || start_bg kube-scheduler "$(kube_bin kube-scheduler)" \
  --kubeconfig "$KC" --authentication-kubeconfig "$KC" --authorization-kubeconfig "$KC" \
  --bind-address 127.0.0.1 --port 0 --leader-elect=false
pid_alive kube-proxy || start_bg kube-proxy "$KUBE_PROXY" --kubeconfig "$KC" --proxy-mode iptables \
  --hostname-override "$NODE_NAME" --cluster-cidr "$POD_CIDR" --nodeport-addresses "$NODE_IP/32" \
  --healthz-bind-address 127.0.0.1:10256 --metrics-bind-address 127.0.0.1:10249 --conntrack-max-per-core 0
if ! pid_alive kubelet; then
  mkdir -p "$CLUSTER_DIR/kubelet"
  sed -e "s#@CLUSTER_DIR@#$CLUSTER_DIR#g" -e "s#@NODE_IP@#$NODE_IP#g" "$CLUSTER_SRC/kubelet-config.yaml" >"$CLUSTER_DIR/etc/kubelet-config.yaml"
  start_bg kubelet "$(kube_bin kubelet)" --config "$CLUSTER_DIR/etc/kubelet-config.yaml" --kubeconfig "$KC" \
    --root-dir "$CLUSTER_DIR/kubelet" --cert-dir "$CLUSTER_DIR/kubelet/pki" --seccomp-profile-root "$CLUSTER_DIR/kubelet/seccomp" \
    --container-runtime remote --container-runtime-endpoint "unix://$CONTAINERD_SOCK" \
    --pod-infra-container-image localhost/pause:dev --node-ip "$NODE_IP" --hostname-override "$NODE_NAME" \
    --node-labels "podsnap.io/local-cluster=true" --v 1
fi
for _ in $(seq 1200); do node_ready && break; sleep 0.25; done
node_ready || { tail -30 "$LOGS/kubelet.log" >&2; die "node $NODE_NAME not Ready (log: $LOGS/kubelet.log)"; }
step "node $NODE_NAME Ready"

# --- cluster objects: storage, default ServiceAccount -----------------------------------------------
sed "s#@CLUSTER_DIR@#$CLUSTER_DIR#g" "$CLUSTER_SRC/storage.yaml" | kc apply -f - >/dev/null
# a claim deleted before (the e2e suite's PVC, a reinstall) leaves the volume Released: free it again
if [ "$(kc get pv podsnap-artifacts -o jsonpath='{.status.phase}')" = Released ]; then
  kc patch pv podsnap-artifacts --type json -p '[{"op":"remove","path":"/spec/claimRef"}]' >/dev/null
fi
for _ in $(seq 200); do kc get serviceaccount default -n default >/dev/null 2>&1 && break; sleep 0.1; done
step "cluster up"
echo "KUBECONFIG=$KUBECONFIG_PATH"
