#!/usr/bin/env bash
# Stops the local cluster started by up.sh: by pid files only (never by process name), then removes
# the pods' leftovers (containerd tasks and containers, network namespaces, mounts, links, iptables
# rules) and the registry. --wipe also removes its state (etcd, PKI, kubelet and containerd roots,
# artifacts volume, the registry's storage);
# the image and kube-proxy caches in $PODSNAP_CACHE stay.
# usage: hack/cluster/down.sh [--wipe]
set -uo pipefail
source "$(dirname "$0")/common.sh"
WIPE=0
for a in "$@"; do case $a in --wipe) WIPE=1;; *) die "unknown option $a (usage: down.sh [--wipe])";; esac; done
need_root
[ -d "$CLUSTER_DIR" ] || { clog "nothing to stop ($CLUSTER_DIR does not exist)"; exit 0; }
exec 9>"$CLUSTER_DIR/.lock"; flock 9
stop() { # stop NAME...: TERM, wait up to 5 s, then KILL; only the pid from NAME's pid file
  local n pid
  for n in "$@"; do pid_alive "$n" && kill "$(cat "$RUN/$n.pid")" 2>/dev/null; done
  for _ in $(seq 50); do
    local any=0; for n in "$@"; do pid_alive "$n" && any=1; done
    [ $any = 0 ] && break; sleep 0.1
  done
  for n in "$@"; do pid=$(cat "$RUN/$n.pid" 2>/dev/null); pid_alive "$n" && kill -9 "$pid" 2>/dev/null; rm -f "$RUN/$n.pid"; done
}
stop kubelet kube-proxy kube-scheduler kube-controller-manager
stop kube-apiserver
stop etcd
# the pods: kill every task in the kubelet's containerd namespace, then remove the containers
if pid_alive containerd; then
  for t in $(ctr -n k8s.io tasks ls -q 2>/dev/null); do ctr -n k8s.io tasks kill -s SIGKILL "$t" >/dev/null 2>&1; done
  sleep 0.5
  for t in $(ctr -n k8s.io tasks ls -q 2>/dev/null); do ctr -n k8s.io tasks delete -f "$t" >/dev/null 2>&1; done
  for c in $(ctr -n k8s.io containers ls -q 2>/dev/null); do ctr -n k8s.io containers rm "$c" >/dev/null 2>&1; done
fi
stop containerd
stop docker-registry
# shim processes whose task is gone exit by themselves; mounts the kubelet and containerd left behind:
grep -oE " ($CLUSTER_DIR/(kubelet|containerd)|/run/containerd|/run/netns/cni-)[^ ]*" /proc/mounts | sort -r | uniq |
  while read -r m; do umount -l "$m" 2>/dev/null; done
for ns in /run/netns/cni-*; do [ -e "$ns" ] && ip netns delete "$(basename "$ns")" 2>/dev/null; done
ip link del cni0 2>/dev/null
ip link del kdummy0 2>/dev/null
# kube-proxy's chains go with the node; our own no-egress rule too
iptables-save 2>/dev/null | grep -q KUBE- && "$(kube_bin kube-proxy 2>/dev/null || echo true)" --cleanup >/dev/null 2>&1
while iptables -t mangle -D PREROUTING -i cni0 -j PODSNAP-NO-EGRESS 2>/dev/null; do :; done
iptables -t mangle -F PODSNAP-NO-EGRESS 2>/dev/null && iptables -t mangle -X PODSNAP-NO-EGRESS 2>/dev/null
# all pods are gone: their addresses are free again
rm -rf "$CLUSTER_DIR/cni/ipam"
if [ $WIPE = 1 ]; then
  rm -rf "$CLUSTER_DIR/etcd" "$PKI" "$KUBECONFIG_PATH" "$CLUSTER_DIR/kubelet" "$CLUSTER_DIR/containerd" \
    "$CLUSTER_DIR/volumes" "$CLUSTER_DIR/etc" "$CLUSTER_DIR/cni" "$CLUSTER_DIR/registry" "$CLUSTER_DIR/images" "$LOGS" "$RUN"
  clog "down, state wiped ($CLUSTER_DIR)"
else
  clog "down (state kept in $CLUSTER_DIR; --wipe removes it)"
fi
