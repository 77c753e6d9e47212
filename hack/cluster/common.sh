# Paths, ports and helpers of the local single-node cluster. Sourced by up.sh, down.sh, build-images.sh.
# Everything the cluster owns lives under $CLUSTER_DIR (default /var/lib/podsnap-cluster); images and
# the kube-proxy build are cached under $PODSNAP_CACHE, so `down.sh --wipe` keeps them.
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
CLUSTER_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$CLUSTER_SRC/../.." && pwd)
CLUSTER_DIR=${PODSNAP_CLUSTER_DIR:-/var/lib/podsnap-cluster}
KUBECONFIG_PATH=$CLUSTER_DIR/kubeconfig
RUN=$CLUSTER_DIR/run          # pid files
LOGS=$CLUSTER_DIR/logs
PKI=$CLUSTER_DIR/pki
IMAGES_CACHE=$PODSNAP_CACHE/images
IMAGES_ARCHIVE=$IMAGES_CACHE/podsnap-images.tar   # one docker-archive, every image, shared base layer
# Private addresses only: the node sits on an empty bridge we own, pods on cni0; nothing is routed out.
NODE_IP=10.99.0.1
POD_CIDR=10.88.0.0/16
SERVICE_CIDR=10.0.0.0/24
# Below the ephemeral port range, so test control planes on free ports never take them.
ETCD_PORT=12379
ETCD_PEER_PORT=12380
API_PORT=16443
NODE_NAME=podsnap-node
CONTAINERD_SOCK=/run/containerd/containerd.sock
# The components, in start order; down.sh stops them in reverse.
COMPONENTS=(docker-registry containerd etcd kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet)
# build-images.sh writes localhost/podsnap-{operator,agent,demo}:dev and localhost/pause:dev into $IMAGES_ARCHIVE.
IMAGE_TAG=dev
# podsnap's images reach the node the way a user's do: `make images` + `make images-push` (hack/images.sh)
# into a real registry (Debian's docker-registry, the distribution registry) on this machine, and the
# kubelet pulls them. Only the pod sandbox image (pause) is imported straight into containerd.
REGISTRY_LISTEN=127.0.0.1:5000
REGISTRY_HOST=localhost:5000
REGISTRY=$REGISTRY_HOST/podsnap          # image.registry of overlays/local-cluster/values.yaml
REGISTRY_DIR=$CLUSTER_DIR/registry       # the registry's storage
PUSH_DIR=$CLUSTER_DIR/images             # hack/images.sh's archives for the cluster (PODSNAP_IMAGES_DIR)
IMAGE_NAMES=(podsnap-operator podsnap-agent podsnap-demo)
PAUSE_IMAGE=localhost/pause:$IMAGE_TAG

clog() { printf '[cluster] %s\n' "$*" >&2; }
need_root() { [ "$(id -u)" = 0 ] || die "the local cluster needs root (containerd, kubelet, iptables): run as root"; }
# pid_alive NAME: the pid file names a live process whose executable is still NAME
pid_alive() {
  local f=$RUN/$1.pid pid
  [ -f "$f" ] || return 1
  pid=$(cat "$f"); [ -n "$pid" ] && [ -d "/proc/$pid" ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "$1"
}
# start_bg NAME CMD...: runs CMD detached (own session, survives make and pytest), logs to $LOGS/NAME.log
start_bg() {
  local name=$1; shift
  mkdir -p "$RUN" "$LOGS"
  # a daemon must not keep any lock its caller holds: fds 8/9 are the build and cluster locks, and a caller
  # under `flock FILE -c ...` (the machine's e2e lock) holds FILE on an fd of flock's choosing; so every
  # inherited fd above 2 is closed before the exec (the daemon's $! is this subshell's pid)
  (
    for fd in /proc/self/fd/*; do
      fd=${fd##*/}
      [ "$fd" -gt 2 ] && eval "exec $fd>&-"
    done 2>/dev/null
    exec setsid "$@" >>"$LOGS/$name.log" 2>&1 </dev/null
  ) &
  echo $! >"$RUN/$name.pid"
}
kube_bin() { # kube_bin NAME: the pinned Kubernetes 1.20 binary (hack/setup.sh links them into .tools/bin)
  local b
  for b in "$REPO_ROOT/.tools/bin/$1" "$PODSNAP_CACHE/kubernetes-1.20.2/bin/$1" "$PODSNAP_CACHE/kube-proxy-1.20.2/bin/$1"; do
    [ -x "$b" ] && { readlink -f "$b"; return 0; }
  done
  return 1
}
kc() { "$REPO_ROOT/.tools/bin/kubectl" --kubeconfig "$KUBECONFIG_PATH" "$@"; }
