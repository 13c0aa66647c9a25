# Shared by the kube sandbox scripts: paths, binary cache key, kubectl wrapper.
# Sourced, never run.
# shellcheck source=../sandbox/lib.sh
KUBE_SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$KUBE_SRC/../sandbox/lib.sh"

# Link flags of build.sh. Part of the cache key, so a flag change rebuilds.
# The -X flags give the binaries their real version (else "v0.0.0-master").
KUBE_LDFLAGS="-s -w -X k8s.io/component-base/version.gitVersion=$SBX_K8S_VERSION \
-X k8s.io/client-go/pkg/version.gitVersion=$SBX_K8S_VERSION \
-X k8s.io/component-base/version.gitTreeState=clean \
-X k8s.io/client-go/pkg/version.gitTreeState=clean"
KWOK_LDFLAGS="-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$SBX_KWOK_VERSION"

# Cache key: the two helper modules (go.mod, go.sum, sources) plus the flags.
kube_bin_key() {
  local h
  h=$( (cd "$KUBE_SRC" && cat k8s/go.mod k8s/go.sum k8s/tools.go k8s/etcd/main.go \
        kwok/go.mod kwok/go.sum && echo "$KUBE_LDFLAGS|$KWOK_LDFLAGS|cgo0|trimpath") |
    sha256sum | cut -c1-12)
  echo "k8s-$SBX_K8S_VERSION-kwok-$SBX_KWOK_VERSION-$h"
}
KUBE_BIN="$SBX_CACHE/bin/$(kube_bin_key)"
KUBE_BINARIES="etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl kwok"

KUBE_STATE="$SBX_STATE/kube"
KUBE_PKI="$KUBE_STATE/pki"
ADMIN_KUBECONFIG="$KUBE_STATE/admin.kubeconfig"
KUBE_ETCD_PEER_PORT=$((SBX_ETCD_PORT + 1))
KUBE_SERVICE_CIDR=10.96.0.0/16
KUBE_SERVICE_IP=10.96.0.1   # first address of the range: the "kubernetes" Service

# Real nodes. Their on-disk homes are outside $SBX_STATE on purpose: the
# containerd image store under $KUBE_NODE_LIB/NAME/containerd survives down, so
# a warm up does not re-import images.
KUBE_NODE_LIB=/var/lib/sbx-kube
KUBE_NODE_RUN=/run/sbx-kube
KUBE_CNI_BIN=/usr/lib/cni          # Debian's containernetworking-plugins
KUBE_PAUSE_IMAGE=sandbox.local/pause:1
# The real nodes' containerd, containerd-shim-runc-v2 and ctr (containerd.sh fetches them).
KUBE_CONTAINERD_BIN="$SBX_CACHE/bin/containerd-$SBX_CONTAINERD_VERSION"
# The DRA driver (containers/dra/) each real node runs, and the DeviceClass for its devices.
KUBE_DRA_DRIVER=gpu.example.com

# Per real node (1-based index N in $SBX_REAL_NODES): pod CIDR 10.244.N.0/24,
# bridge sbxbrN holding 10.244.N.1 (also the node's InternalIP), kubelet port
# 10250+10*(N-1).
# shellcheck disable=SC2086 # word splitting wanted
real_nodes() { printf "%s\n" $SBX_REAL_NODES; }
real_node_index() {
  local n=0 x
  for x in $SBX_REAL_NODES; do n=$((n + 1)); [ "$x" = "$1" ] && { echo $n; return; }; done
  die "unknown real node $1"
}
node_bridge() { echo "sbxbr$(real_node_index "$1")"; }
node_ip() { echo "10.244.$(real_node_index "$1").1"; }
node_pod_cidr() { echo "10.244.$(real_node_index "$1").0/24"; }
node_kubelet_port() { echo $((10250 + 10 * ($(real_node_index "$1") - 1))); }
node_sock() { echo "$KUBE_NODE_RUN/$1/containerd.sock"; }
node_kubelet_root() { echo "$KUBE_NODE_LIB/$1/kubelet"; }   # the kubelet's --root-dir
# CDI specs: the DRA driver writes them here, the node's containerd reads them (cdi_spec_dirs).
node_cdi_dir() { echo "$KUBE_NODE_RUN/$1/cdi"; }
# v1 cgroup hierarchies (hybrid host: cgroup v1 controllers + v2 at unified).
cgroup_hierarchies() {
  local d
  for d in /sys/fs/cgroup/*/; do
    d=${d%/}
    [ -e "$d/cgroup.procs" ] && echo "$d"
  done
}

kc() { "$KUBE_BIN/kubectl" --kubeconfig "$ADMIN_KUBECONFIG" "$@"; }
