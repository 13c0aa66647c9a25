#!/usr/bin/env bash
# Stop everything up.sh started and clean up, so the next up starts clean:
# kwok, DRA kubelet plugins, kubelets, containers, containerd shims,
# containerds, control plane;
# pod mounts and network namespaces, CNI bridges, cgroups, etcd data and
# per-node kubelet state. Kept: PKI, kubeconfigs, and each node's containerd
# image store (so a warm up needs no image import).
# Usage: containers/kube/down.sh
set -euo pipefail
. "$(dirname "$0")/common.sh"
t0=$SECONDS

# alive PID: exists and is not a zombie. PID 1 on this machine reaps orphans
# about 1.5 s late, and lib.sh's stop_bg waits for the zombie too (2 s per
# daemon); so stop here in parallel and count a zombie as stopped.
alive() { local s; s=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) && [ "$s" != Z ]; }

# stop_daemons GRACE NAME...: TERM each daemon's session at once, KILL what
# is still alive after GRACE seconds, drop the pid files.
stop_daemons() {
  local grace=$1 name pid i left pids=()
  shift
  for name in "$@"; do
    pid=$(cat "$SBX_RUN/$name.pid" 2>/dev/null) || continue
    [ -n "$pid" ] || continue
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    pids+=("$pid")
  done
  for ((i = 0; i < grace * 10; i++)); do
    left=0
    for pid in "${pids[@]}"; do alive "$pid" && left=1; done
    [ "$left" = 0 ] && break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do
    alive "$pid" && { kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true; }
  done
  for name in "$@"; do rm -f "$SBX_RUN/$name.pid"; done
}

# pids_in CGROUP_DIR: every pid in that v1 cgroup tree.
pids_in() { [ -d "$1" ] && find "$1" -name cgroup.procs -exec cat {} + 2>/dev/null || true; }

# kill_cgroup DIR: SIGKILL every process in the tree until it is empty.
kill_cgroup() {
  local i p pids
  for ((i = 0; i < 50; i++)); do
    pids=$(pids_in "$1")
    [ -z "$pids" ] && return 0
    for p in $pids; do kill -KILL "$p" 2>/dev/null || true; done
    sleep 0.1
  done
  say "warning: processes left in $1: $(pids_in "$1" | tr '\n' ' ')"
}

# rmdir_cgroup NAME: remove the cgroup NAME and its children in every hierarchy.
rmdir_cgroup() {
  local h
  for h in $(cgroup_hierarchies) /sys/fs/cgroup/unified; do
    [ -d "$h/$1" ] && find "$h/$1" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
}

# unmount_under DIR...: unmount every mount point below the given dirs,
# deepest first.
unmount_under() {
  local m d
  for d in "$@"; do
    awk -v d="$d" '$5 == d || index($5, d "/") == 1 {print $5}' /proc/self/mountinfo
  done | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done
}

# Pods with hostPort get per-pod NAT chains from the CNI portmap plugin; the
# pods were killed without a CNI DEL, so drop those chains (only CNI-HOSTPORT-*
# and CNI-DN-*, which nothing but our pods creates on this host).
cleanup_hostport_iptables() {
  local rule chain
  iptables -t nat -S 2>/dev/null | grep -q 'CNI-HOSTPORT\|CNI-DN-' || return 0
  iptables -t nat -S | grep -E '^-A (PREROUTING|OUTPUT|POSTROUTING) .*-j CNI-HOSTPORT' |
    while read -r rule; do eval "iptables -t nat ${rule/-A/-D}" || true; done
  for chain in $(iptables -t nat -S | awk '/^-N CNI-(HOSTPORT|DN-)/ {print $2}'); do
    iptables -t nat -F "$chain" || true
  done
  for chain in $(iptables -t nat -S | awk '/^-N CNI-(HOSTPORT|DN-)/ {print $2}'); do
    iptables -t nat -X "$chain" || true
  done
}

# Real nodes to clean: the configured ones plus any that an earlier up left
# behind (SBX_REAL_NODES may have changed since).
# shellcheck disable=SC2012 # plain names here
down_nodes=$({
  real_nodes
  ls "$SBX_RUN" 2>/dev/null | sed -n 's/^\(kubelet\|containerd\)-\(.*\)\.pid$/\2/p'
  ls /sys/fs/cgroup/pids 2>/dev/null | sed -n 's/^sbx-\(.*\)-daemons$/\1/p'
  ls /etc/cni 2>/dev/null | sed -n 's/^sbx-//p'
} | sort -u)
nodes=() ctrds=()
for n in $down_nodes; do nodes+=("dra-plugin-$n" "kubelet-$n"); ctrds+=("containerd-$n"); done
stop_daemons 10 kwok kube-proxy "${nodes[@]}"
# kube-proxy's iptables chains (KUBE-*) go with it.
[ -x "$KUBE_BIN/kube-proxy" ] && "$KUBE_BIN/kube-proxy" --cleanup --v=0 >/dev/null 2>&1 || true

for n in $down_nodes; do
  sock=$(node_sock "$n")
  # Containers first (they live in the kubelet's cgroup root), then let
  # containerd forget them so it does not report stale pods on the next up.
  kill_cgroup "/sys/fs/cgroup/pids/sbx-$n"
  if is_running "containerd-$n" && [ -S "$sock" ]; then
    ctr=ctr   # the nodes' own (containerd.sh), else the host's
    [ -x "$KUBE_CONTAINERD_BIN/ctr" ] && ctr="$KUBE_CONTAINERD_BIN/ctr"
    ctr_n() { timeout 10 "$ctr" -n k8s.io --address "$sock" "$@"; }
    for id in $(ctr_n tasks ls -q 2>/dev/null); do ctr_n tasks rm -f "$id" >/dev/null 2>&1 || true; done
    ids=$(ctr_n containers ls -q 2>/dev/null || true)
    # shellcheck disable=SC2086 # one argument per id
    [ -n "$ids" ] && ctr_n containers rm $ids >/dev/null 2>&1 || true
  fi
done
stop_daemons 10 "${ctrds[@]}"

for n in $down_nodes; do
  # The bridge name is in the node's CNI config (read before it goes).
  br=$(sed -n 's/.*"bridge": "\([^"]*\)".*/\1/p' "/etc/cni/sbx-$n/10-sbx.conflist" 2>/dev/null || true)
  # Shims (and anything else the node's daemons left) share the daemon cgroup.
  kill_cgroup "/sys/fs/cgroup/pids/sbx-$n-daemons"
  # containerd 1.6 and 1.7 shims put their sockets in /run/containerd/s whatever the
  # state dir; each bundle's "address" file names its shim's socket.
  for a in "$KUBE_NODE_RUN/$n"/containerd/io.containerd.runtime.v2.task/*/*/address; do
    [ -f "$a" ] && rm -f "$(sed 's|^unix://||' "$a")"
  done
  # Rootfs overlays and netns files (containerd state), volume tmpfs (kubelet).
  unmount_under "$KUBE_NODE_RUN/$n" "$KUBE_NODE_LIB/$n/kubelet"
  rm -rf "${KUBE_NODE_RUN:?}/$n" "$KUBE_NODE_LIB/$n"/{kubelet,pod-logs,cni-ipam,volume-plugins,opt} \
    "/etc/cni/sbx-$n" || say "warning: could not remove all of $n's state"
  if [ -n "$br" ] && ip link show "$br" >/dev/null 2>&1; then ip link del "$br"; fi
  rmdir_cgroup "sbx-$n"
  rmdir_cgroup "sbx-$n-daemons"
  # The kubelet's symlinks into our pod-logs dir (it hard-codes /var/log/containers).
  find /var/log/containers -maxdepth 1 -type l -lname "$KUBE_NODE_LIB/$n/*" -delete 2>/dev/null || true
done
rmdir /var/log/containers /run/containerd/s /run/containerd /etc/cni 2>/dev/null || true
cleanup_hostport_iptables

stop_daemons 15 kube-scheduler kube-controller-manager kube-apiserver etcd
rm -rf "$KUBE_STATE/etcd"
# The kubelets hard-code /var/lib/kubelet/device-plugins; drop it if it only
# holds what they put there.
if [ -d /var/lib/kubelet ] && [ -z "$(find /var/lib/kubelet -mindepth 1 \
  ! -path /var/lib/kubelet/device-plugins ! -name kubelet.sock ! -name kubelet_internal_checkpoint \
  ! -name DEPRECATION -print -quit)" ]; then
  rm -rf /var/lib/kubelet
fi
say "kube down in $((SECONDS - t0))s"
