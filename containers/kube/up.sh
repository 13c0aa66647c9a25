#!/usr/bin/env bash
# Start the Kubernetes half of the sandbox (idempotent; a second run only
# starts what is not running):
#   etcd, kube-apiserver, kube-controller-manager, kube-scheduler on loopback;
#   real nodes $SBX_REAL_NODES: one containerd + kubelet + DRA kubelet plugin each;
#   simulated nodes $(sim_node_names) kept Ready by kwok.
# All nodes carry label slurm-k8s-bridge/bridged=true and taint
# slurm-k8s-bridge/bridged=true:NoSchedule; type=real or type=kwok.
# Admin kubeconfig: $SBX_STATE/kube/admin.kubeconfig.
# Usage: containers/kube/up.sh
set -euo pipefail
. "$(dirname "$0")/common.sh"
. "$KUBE_SRC/pki.sh"
t0=$SECONDS

# ---------------------------------------------------------------- host setup
ensure_host_packages() {
  local pkgs=()
  command -v containerd >/dev/null || pkgs+=(containerd)
  command -v runc >/dev/null || pkgs+=(runc)
  [ -x "$KUBE_CNI_BIN/bridge" ] || pkgs+=(containernetworking-plugins)
  command -v openssl >/dev/null || pkgs+=(openssl)
  command -v curl >/dev/null || pkgs+=(curl)
  command -v iptables >/dev/null || pkgs+=(iptables)
  command -v unshare >/dev/null || pkgs+=(util-linux)
  [ ${#pkgs[@]} = 0 ] && return 0
  say "installing ${pkgs[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >/dev/null
  # Debian starts containerd via systemd where there is one; ours are private.
  command -v systemctl >/dev/null && [ -d /run/systemd/system ] &&
    systemctl disable --now containerd >/dev/null 2>&1 || true
}
ensure_host_packages
"$KUBE_SRC/build.sh" >/dev/null
# kubectl of the same version, for `make sandbox-env` users and the scripts.
mkdir -p "$SBX_STATE/bin"
ln -sfn "$KUBE_BIN/kubectl" "$SBX_STATE/bin/kubectl"
# Helm, for make bridge-deploy's chart (and whoever tries the chart by hand): built once from the
# Go module proxy like the binaries above, cached.
helm_path=$("$KUBE_SRC/../helm/build.sh")
ln -sfn "$helm_path" "$SBX_STATE/bin/helm"
# The real nodes' containerd (trixie's 1.7, for CDI; see containerd.sh) and their DRA driver.
"$KUBE_SRC/containerd.sh" >/dev/null
dra_plugin=$("$KUBE_SRC/../dra/build.sh")
# The image scripts below import with the nodes' own ctr.
export PATH="$KUBE_CONTAINERD_BIN:$PATH"
mkdir -p "$KUBE_STATE" "$KUBE_NODE_LIB" "$KUBE_NODE_RUN"
pki_ensure
kubeconfigs_ensure

curl_api() { curl -sf --max-time 2 --cacert "$KUBE_PKI/ca.crt" --cert "$KUBE_PKI/admin.crt" \
  --key "$KUBE_PKI/admin.key" "https://127.0.0.1:$SBX_APISERVER_PORT$1"; }

# --------------------------------------------------------------- control plane
start_etcd() {
  # --unsafe-no-fsync: the data is thrown away by down.sh anyway, and fsync on
  # every write is most of etcd's latency here.
  start_bg etcd "$KUBE_BIN/etcd" --name sandbox --data-dir "$KUBE_STATE/etcd" \
    --listen-client-urls "http://127.0.0.1:$SBX_ETCD_PORT" \
    --advertise-client-urls "http://127.0.0.1:$SBX_ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$KUBE_ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$KUBE_ETCD_PEER_PORT" \
    --initial-cluster "sandbox=http://127.0.0.1:$KUBE_ETCD_PEER_PORT" \
    --unsafe-no-fsync --log-level warn --quota-backend-bytes 4294967296
}

start_apiserver() {
  # The apiserver reaches kubelets (logs, exec) by the node's Hostname address
  # (--kubelet-preferred-address-types=Hostname). It runs in a private mount
  # namespace whose /etc/hosts maps the real node names to 127.0.0.1, where the
  # kubelets listen, and whose resolv.conf points at loopback, so no lookup or
  # connection ever leaves the host. kwok nodes have no Hostname address: logs
  # of simulated pods fail at once instead of dialling a fake IP.
  local n
  { echo "127.0.0.1 localhost"; for n in $SBX_REAL_NODES; do echo "127.0.0.1 $n"; done; } \
    >"$KUBE_STATE/apiserver-hosts"
  echo "nameserver 127.0.0.1" >"$KUBE_STATE/apiserver-resolv.conf"
  # MutatingAdmissionPolicy (and its API, admissionregistration.k8s.io/v1beta1) is beta and off by
  # default in 1.34; the bridge's chart sets managed namespaces' pods' schedulerName with one.
  local args=(
    --bind-address=0.0.0.0 --secure-port="$SBX_APISERVER_PORT"
    --advertise-address="$SBX_CONTROL_IP"
    --etcd-servers="http://127.0.0.1:$SBX_ETCD_PORT"
    --client-ca-file="$KUBE_PKI/ca.crt"
    --tls-cert-file="$KUBE_PKI/apiserver.crt" --tls-private-key-file="$KUBE_PKI/apiserver.key"
    --kubelet-client-certificate="$KUBE_PKI/apiserver-kubelet-client.crt"
    --kubelet-client-key="$KUBE_PKI/apiserver-kubelet-client.key"
    --kubelet-preferred-address-types=Hostname
    --authorization-mode=Node,RBAC
    --enable-admission-plugins=NodeRestriction
    --disable-admission-plugins=TaintNodesByCondition
    --service-cluster-ip-range="$KUBE_SERVICE_CIDR"
    --service-account-issuer=https://kubernetes.default.svc.cluster.local
    --service-account-key-file="$KUBE_PKI/sa.pub"
    --service-account-signing-key-file="$KUBE_PKI/sa.key"
    --allow-privileged=true --profiling=false --event-ttl=1h
    --feature-gates=MutatingAdmissionPolicy=true
    --runtime-config=admissionregistration.k8s.io/v1beta1=true
  )
  # A running apiserver started with another binary or flags (an older sandbox) is restarted, as
  # start_containerd does with its config: the copy in $SBX_RUN is what the running one started with.
  local want="$KUBE_STATE/kube-apiserver.args"
  printf '%s\n' "$KUBE_BIN/kube-apiserver" "${args[@]}" | write_if_changed "$want"
  if is_running kube-apiserver && ! cmp -s "$want" "$SBX_RUN/kube-apiserver.args"; then
    say "kube-apiserver runs with other flags; restarting it"
    stop_bg kube-apiserver
  fi
  is_running kube-apiserver && return 0
  cp "$want" "$SBX_RUN/kube-apiserver.args"
  start_bg kube-apiserver unshare --mount --propagation private \
    sh -c 'mount --bind "$1" /etc/hosts && mount --bind "$2" /etc/resolv.conf && shift 2 && exec "$@"' \
    sh "$KUBE_STATE/apiserver-hosts" "$KUBE_STATE/apiserver-resolv.conf" \
    "$KUBE_BIN/kube-apiserver" "${args[@]}"
}

start_controllers() {
  local kcm="$KUBE_STATE/controller-manager.kubeconfig" sch="$KUBE_STATE/scheduler.kubeconfig"
  # Leader election off: one instance each, and it saves the ~2-15 s lease wait.
  # Higher client QPS: kcm creates one service account per controller at start
  # (~35 of them) and starts its informers only after all; at the default 20
  # QPS that alone took ~4 s. Grace period: see kwok.yaml (lease renewals).
  # No ttl-controller: it rewrites an annotation on every node each time the
  # node count crosses 100/500/1000 (kubelets then use their default TTL).
  # And the apiserver has no TaintNodesByCondition: it would give every new
  # node a not-ready taint that kcm then removes, one more write per node.
  start_bg kube-controller-manager "$KUBE_BIN/kube-controller-manager" \
    --kubeconfig="$kcm" --authentication-kubeconfig="$kcm" --authorization-kubeconfig="$kcm" \
    --bind-address=127.0.0.1 --leader-elect=false \
    --use-service-account-credentials=true \
    --service-account-private-key-file="$KUBE_PKI/sa.key" \
    --root-ca-file="$KUBE_PKI/ca.crt" \
    --cluster-signing-cert-file="$KUBE_PKI/ca.crt" --cluster-signing-key-file="$KUBE_PKI/ca.key" \
    --flex-volume-plugin-dir="$KUBE_STATE/kcm-flexvolume" \
    --kube-api-qps=200 --kube-api-burst=400 --controllers='*,-ttl-controller' \
    --node-monitor-grace-period=90s \
    --profiling=false
  start_bg kube-scheduler "$KUBE_BIN/kube-scheduler" \
    --kubeconfig="$sch" --authentication-kubeconfig="$sch" --authorization-kubeconfig="$sch" \
    --bind-address=127.0.0.1 --leader-elect=false --profiling=false
}

# ----------------------------------------------------------------- real nodes
# cgroup_mk PATH: create a v1 cgroup in every hierarchy (cpuset needs cpus/mems
# copied from the root before a task may join).
cgroup_mk() {
  local h
  for h in $(cgroup_hierarchies); do
    mkdir -p "$h/$1"
    case $h in */cpuset)
      [ -s "$h/$1/cpuset.cpus" ] || cat "$h/cpuset.cpus" >"$h/$1/cpuset.cpus"
      [ -s "$h/$1/cpuset.mems" ] || cat "$h/cpuset.mems" >"$h/$1/cpuset.mems" ;;
    esac
  done
}

prepare_node() {
  local n=$1 br ip cidr dir run
  dir="$KUBE_NODE_LIB/$n" run="$KUBE_NODE_RUN/$n"
  br=$(node_bridge "$n") ip=$(node_ip "$n") cidr=$(node_pod_cidr "$n")
  mkdir -p "$dir"/{kubelet,pod-logs,containerd,volume-plugins,cni-ipam} "$run" \
    "$(node_cdi_dir "$n")" "/etc/cni/sbx-$n"
  # The kubelet's cgroupRoot: each kubelet has its own tree, so neither sees
  # the other's pod cgroups as orphans to clean up.
  cgroup_mk "sbx-$n"
  # containerd, its shims and the kubelet go here so down.sh can find them all.
  mkdir -p "/sys/fs/cgroup/pids/sbx-$n-daemons"

  # The CNI bridge exists before the kubelet starts because its gateway
  # address is the node's InternalIP (--node-ip must be a local, non-loopback
  # address; nothing connects to it: the apiserver uses the Hostname address).
  if ! ip link show "$br" >/dev/null 2>&1; then
    ip link add "$br" type bridge
  fi
  # A fixed address: a bridge without one takes its ports' lowest, which changes when that pod's
  # veth goes, and the node's other pods keep sending to the old gateway address until their ARP
  # entry expires (~45 s without a network: a dask worker lost its scheduler when a job beside it
  # was cancelled).
  ip link set "$br" address "$(printf '02:5b:78:00:00:%02x' "$(real_node_index "$n")")"
  ip addr replace "$ip/24" dev "$br"
  ip link set "$br" up
  cat >"/etc/cni/sbx-$n/10-sbx.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "sbx-$n",
  "plugins": [
    {
      "type": "bridge", "bridge": "$br", "isGateway": true, "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local", "dataDir": "$dir/cni-ipam",
        "ranges": [[{"subnet": "$cidr", "gateway": "$ip"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
  # No registry exists: every pull (of an image not imported) goes to a closed
  # loopback port and fails at once -> ErrImagePull/ImagePullBackOff, and no
  # DNS lookup of a registry name leaves the host.
  # (containerd 1.6 rejects a hosts.toml without a [host] table.)
  local reg
  for reg in _default sandbox.local docker.io registry.k8s.io; do
    mkdir -p "$dir/certs.d/$reg"
    printf 'server = "http://127.0.0.1:1"\n[host."http://127.0.0.1:1"]\n  capabilities = ["pull", "resolve"]\n' \
      >"$dir/certs.d/$reg/hosts.toml"
  done

  # One containerd per node: own socket, root, state, runc root, CNI config, CDI
  # spec dir. Two kubelets sharing one containerd would kill each other's pods.
  # (Config version 2: containerd 1.7 reads it.) Rewritten only when it changes:
  # start_containerd restarts a node whose containerd runs with another one.
  write_if_changed "$KUBE_STATE/containerd-$n.toml" <<EOF
version = 2
root = "$dir/containerd"
state = "$run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$run/containerd.sock"
[ttrpc]
  address = "$run/containerd.sock.ttrpc"
[debug]
  level = "warn"
[plugins."io.containerd.internal.v1.opt"]
  path = "$dir/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$KUBE_PAUSE_IMAGE"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  disable_apparmor = true
  # This host's root lacks CAP_SYS_RESOURCE: runc cannot lower oom_score_adj
  # (the pause container asks for -998) and fails with "can't get final
  # child's PID from pipe: EOF". Clamp to containerd's own value instead.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  # DRA: the node's driver writes a CDI spec per prepared claim; the kubelet
  # names its devices in the CRI request and containerd applies their edits.
  enable_cdi = true
  cdi_spec_dirs = ["$(node_cdi_dir "$n")"]
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$run/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$KUBE_CNI_BIN"
    conf_dir = "/etc/cni/sbx-$n"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$dir/certs.d"
EOF

  cat >"$KUBE_STATE/kubelet-$n.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# cgroup v1 host whose init is not systemd: cgroupfs, as containerd's runc.
cgroupDriver: cgroupfs
cgroupRoot: /sbx-$n
# 1.34 only warns about cgroup v1; say that we accept it (1.35+ would refuse).
failCgroupV1: false
# No swap here, but never refuse to start if a host has some.
failSwapOn: false
containerRuntimeEndpoint: unix://$run/containerd.sock
# Loopback only, own port per node; the apiserver reaches it via /etc/hosts.
address: 127.0.0.1
port: $(node_kubelet_port "$n")
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $KUBE_PKI/ca.crt}
authorization: {mode: Webhook}
registerWithTaints:
- {key: slurm-k8s-bridge/bridged, value: "true", effect: NoSchedule}
# Per-node paths that default to shared host paths.
podLogsDir: $dir/pod-logs
volumePluginDir: $dir/volume-plugins
# No cluster DNS, and pods must not get the host's resolver (no traffic out).
resolvConf: ""
clusterDomain: cluster.local
# Two kubelets share one disk and 24 GiB: evict only when really short.
evictionHard: {memory.available: 200Mi, nodefs.available: 2%, imagefs.available: 2%, nodefs.inodesFree: 2%}
imageGCHighThresholdPercent: 95
imageGCLowThresholdPercent: 90
serializeImagePulls: false
maxPods: 110
# No kube-proxy here: skip the KUBE-FIREWALL/canary iptables chains the
# kubelet would otherwise add to the host's filter table (and leave behind).
makeIPTablesUtilChains: false
EOF
}

# The node daemons start through sh, which first moves itself into the node's
# daemon cgroup: containerd's shims inherit it, and down.sh finds them there.
# containerd is $KUBE_CONTAINERD_BIN's, its directory first on its PATH so that
# it starts its own shim (not the host's 1.6 one); runc is the host's.
# A containerd that runs another binary or config (e.g. the host's 1.6 of an
# older sandbox) is restarted, and the node's kubelet with it; the pods'
# containers keep running (their shims are not in containerd's process group).
start_containerd() {
  local n=$1 cfg="$KUBE_STATE/containerd-$1.toml" pid exe
  if is_running "containerd-$n"; then
    pid=$(cat "$SBX_RUN/containerd-$n.pid")
    exe=$(readlink "/proc/$pid/exe" || true)
    if [ "$exe" = "$KUBE_CONTAINERD_BIN/containerd" ] && cmp -s "$cfg" "$SBX_RUN/containerd-$n.toml"; then
      return 0
    fi
    say "$n: containerd runs ${exe:-?} with another config; restarting it and kubelet-$n"
    stop_bg "kubelet-$n"
    stop_bg "containerd-$n"
  fi
  cp "$cfg" "$SBX_RUN/containerd-$n.toml"   # what the running one was started with
  start_bg "containerd-$n" sh -c 'echo $$ >"$0" && exec "$@"' \
    "/sys/fs/cgroup/pids/sbx-$n-daemons/cgroup.procs" \
    env PATH="$KUBE_CONTAINERD_BIN:$PATH" "$KUBE_CONTAINERD_BIN/containerd" --config "$cfg"
}

# Flags beyond the config file:
#   --hostname-override  the node name (several kubelets, one host name);
#   --node-ip            must be a local non-loopback address (the kubelet
#                        rejects 127.x); without it the kubelet would look
#                        its name up in DNS. The node's bridge address serves;
#   --cert-dir           defaults to /var/lib/kubelet/pki whatever --root-dir;
#   --node-labels        NodeRestriction allows these (not *.kubernetes.io);
#   --vmodule            logs "Deleted ResourceSlices" when it has wiped the
#                        node's slices, which it does once at start-up (see
#                        start_dra_plugin).
# A kubelet that starts takes its node's DRA plugin down; start_dra_plugin
# starts it again once this kubelet has wiped the node's slices.
declare -A kubelet_log_from=()
start_kubelet() {
  local n=$1
  is_running "kubelet-$n" && return 0
  stop_bg "dra-plugin-$n"
  kubelet_log_from[$n]=$(( $(stat -c %s "$SBX_LOG/kubelet-$n.log" 2>/dev/null || echo 0) + 1 ))
  start_bg "kubelet-$n" sh -c 'echo $$ >"$0" && exec "$@"' \
    "/sys/fs/cgroup/pids/sbx-$n-daemons/cgroup.procs" \
    "$KUBE_BIN/kubelet" --config="$KUBE_STATE/kubelet-$n.yaml" \
    --kubeconfig="$KUBE_STATE/kubelet-$n.kubeconfig" \
    --root-dir="$(node_kubelet_root "$n")" --cert-dir="$(node_kubelet_root "$n")/pki" \
    --hostname-override="$n" --node-ip="$(node_ip "$n")" \
    --node-labels="slurm-k8s-bridge/bridged=true,type=real" \
    --vmodule=dra_plugin_manager=3
}

# ------------------------------------------------------------------------ DRA
# The DRA kubelet plugin of node N (containers/dra/: mock GPUs gpu-0.. of driver
# gpu.example.com, $SBX_GPUS_PER_NODE per node). It registers with its kubelet
# through the kubelet's plugins_registry, publishes the node's ResourceSlice (pool
# = node name) and, when the kubelet prepares a claim, writes a CDI spec into the
# dir the node's containerd reads (env GPU_DEVICE_<i>=gpu-<i> per device).
# Credentials: the node's own kubelet kubeconfig; the Node authorizer and
# NodeRestriction let a node publish its own ResourceSlices and read the claims
# of its pods, nothing more. NODE_NAME: the driver's common CDI device puts it
# into KUBERNETES_NODE_NAME. Started once the node is registered (the slice's
# owner is the Node object).
# Order matters: a kubelet deletes its node's ResourceSlices at start-up (it
# retries until its Node exists), and the driver (dynamic-resource-allocation
# v0.36's ResourceSlice controller) does not always publish again: a slice it
# has just updated and that is deleted within its mutation cache's minute stays
# gone. So the plugin starts after its kubelet's wipe, and after our own delete
# of the node's slices, so that it always creates them (a created slice that is
# deleted later is created again within a minute).
kubelet_wiped() {
  tail -c "+${kubelet_log_from[$1]}" "$SBX_LOG/kubelet-$1.log" | grep -q '"Deleted ResourceSlices"'
}
# The plugin publishes its slices before its kubelet has registered it; until then
# the kubelet fails any pod with a claim ("DRA driver ... is not registered") and
# tries again only after its 10 s back-off. A plugin that replaces a killed one is
# first unregistered (its socket is replaced), then registered.
plugin_registered() {
  tail -c "+$2" "$SBX_LOG/kubelet-$1.log" | grep -q '"Registered DRA plugin"'
}
start_dra_plugin() {
  local n=$1 root log_from
  is_running "dra-plugin-$n" && return 0
  if [ -n "${kubelet_log_from[$n]:-}" ]; then
    wait_for "kubelet-$n's start-up wipe of its ResourceSlices" 60 kubelet_wiped "$n"
  fi
  kc delete resourceslices --field-selector "spec.nodeName=$n" >/dev/null
  root=$(node_kubelet_root "$n")
  log_from=$(( $(stat -c %s "$SBX_LOG/kubelet-$n.log" 2>/dev/null || echo 0) + 1 ))
  start_bg "dra-plugin-$n" sh -c 'echo $$ >"$0" && exec "$@"' \
    "/sys/fs/cgroup/pids/sbx-$n-daemons/cgroup.procs" \
    env NODE_NAME="$n" "$dra_plugin" --node-name "$n" \
    --kubeconfig "$KUBE_STATE/kubelet-$n.kubeconfig" \
    --cdi-root "$(node_cdi_dir "$n")" \
    --kubelet-registrar-directory-path "$root/plugins_registry" \
    --kubelet-plugins-directory-path "$root/plugins" \
    --num-devices "$SBX_GPUS_PER_NODE" --device-profile gpu \
    --healthcheck-port -1 --metrics-port -1
  wait_for "kubelet-$n's registration of its DRA plugin" 60 plugin_registered "$n" "$log_from"
}

# The class pods' claims ask for: every device of the driver.
apply_device_class() {
  kc apply -f - >/dev/null <<EOF
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: $KUBE_DRA_DRIVER
spec:
  selectors:
  - cel:
      expression: "device.driver == '$KUBE_DRA_DRIVER'"
EOF
}

# Every real node has published its driver's ResourceSlice.
all_slices_published() {
  local have n
  have=$(kc get resourceslices --field-selector "spec.driver=$KUBE_DRA_DRIVER" \
    -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}')
  for n in $SBX_REAL_NODES; do grep -qx "$n" <<<"$have" || return 1; done
}

# ------------------------------------------------------------------ kube-proxy
# One kube-proxy for the host: both real nodes share its network namespace. It gives
# Services their virtual IPs (iptables), for pods and for the host itself, where the
# slurmds' waiters reach the bridge's Service.
start_kube_proxy() {
  # kube-proxy watches its config file and exits when it changes: only a real change may touch it
  # (sandbox-up on a running sandbox restarts nothing).
  write_if_changed "$KUBE_STATE/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $KUBE_STATE/kube-proxy.kubeconfig
mode: iptables
clusterCIDR: 10.244.0.0/16
hostnameOverride: $(real_nodes | head -1)
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# Leave the host's conntrack table size and route_localnet alone.
conntrack:
  maxPerCore: 0
iptables:
  localhostNodePorts: false
  minSyncPeriod: 200ms
EOF
  start_bg kube-proxy "$KUBE_BIN/kube-proxy" --config="$KUBE_STATE/kube-proxy.yaml" --v=1
}

# ------------------------------------------------------------------ kwok nodes
start_kwok() {
  start_bg kwok "$KUBE_BIN/kwok" --kubeconfig="$KUBE_STATE/kwok.kubeconfig" \
    --config="$KUBE_SRC/kwok.yaml" --v=WARN
}

# Create the missing ksimNNNN Node objects; kwok makes them Ready and keeps
# them so. See simnodes.py for what each node looks like.
create_sim_nodes() {
  local py=python3
  [ -x /usr/bin/python3 ] && py=/usr/bin/python3   # skip a pyenv shim's startup
  # shellcheck disable=SC2046 # one argument per node name
  SBX_KWOK_VERSION=$SBX_KWOK_VERSION "$py" "$KUBE_SRC/simnodes.py" "$KUBE_PKI" "$SBX_APISERVER_PORT" $(sim_node_names) >/dev/null
}

ready_nodes() { kc get nodes --no-headers 2>/dev/null | awk '$2 == "Ready"' | wc -l; }
all_nodes_ready() {
  [ "$(ready_nodes)" -ge "$(( $(real_nodes | wc -l) + SBX_SIM_NODES ))" ]
}

# ----------------------------------------------------------------------- main
ensure_control_ip
start_etcd
for n in $SBX_REAL_NODES; do prepare_node "$n"; done
wait_for "etcd" 30 curl -sf "http://127.0.0.1:$SBX_ETCD_PORT/health"
start_apiserver
# containerd and the image import run while the apiserver boots.
socks=()
for n in $SBX_REAL_NODES; do
  start_containerd "$n"
  socks+=("$(node_sock "$n")")
done
# Answering, not only its socket there: a containerd that crashed left its socket file behind.
for s in "${socks[@]}"; do wait_for "containerd $s" 30 ctr --address "$s" version; done
"$KUBE_SRC/../images/build.sh" "${socks[@]}"
"$KUBE_SRC/../images/agent.sh" "${socks[@]}"
"$KUBE_SRC/../images/mpi.sh" "${socks[@]}"
wait_for "kube-apiserver" 60 curl_api /readyz
start_kube_proxy
# Sim nodes before the controllers and kwok: the apiserver then has both cores
# for the creates (1,000 nodes: ~6 s instead of ~14 s while kwok reacts).
create_sim_nodes
start_controllers
start_kwok
for n in $SBX_REAL_NODES; do start_kubelet "$n"; done
if ! (wait_for "all $((SBX_SIM_NODES + $(real_nodes | wc -l))) nodes Ready" 120 all_nodes_ready); then
  # Which ones, and what their kubelets or kwok said last: CI keeps no log directory.
  kc get nodes --no-headers 2>&1 | awk '$2 != "Ready"' >&2
  for n in $SBX_REAL_NODES; do tail -n 5 "$SBX_LOG/kubelet-$n.log" >&2 2>/dev/null || true; done
  tail -n 5 "$SBX_LOG/kwok.log" >&2 2>/dev/null || true
  die "not every node became Ready (above: the ones that did not, and the last lines of their logs)"
fi
for n in $SBX_REAL_NODES; do start_dra_plugin "$n"; done
apply_device_class
# The kwok nodes' mock GPUs, for the bridge's simdra partition (no driver there: plain
# ResourceSlices, containers/dra/sim-slices.sh); applied only when some are missing.
sim_slices=$(kc get resourceslices -o name | grep -c -- '-gpu.example.com-sim$' || true)
[ "$sim_slices" -ge "$SBX_SIM_NODES" ] || "$KUBE_SRC/../dra/sim-slices.sh"
wait_for "the real nodes' ResourceSlices ($KUBE_DRA_DRIVER)" 60 all_slices_published
wait_for "kube-proxy" 30 curl -sf http://127.0.0.1:10256/healthz
# Pods can only be created once the namespace's default ServiceAccount exists.
wait_for "default service account" 60 kc -n default get serviceaccount default
say "kube up in $((SECONDS - t0))s: $(ready_nodes) nodes Ready; KUBECONFIG=$ADMIN_KUBECONFIG"
