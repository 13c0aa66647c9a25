# Sandbox settings: versions, names and paths shared by every sandbox script.
# Sourced, never run. Each value can be overridden from the environment.

# Pinned versions. Kubernetes 1.34 is the last line whose kubelet runs on a
# cgroup-v1 host without overrides.
: "${SBX_K8S_VERSION:=v1.34.4}"          # must match containers/kube/k8s/go.mod
: "${SBX_KWOK_VERSION:=v0.7.0}"          # must match containers/kube/kwok/go.mod
: "${SBX_DEBIAN_SUITE:=sid}"              # sid ships Slurm 26.05.x
: "${SBX_DEBIAN_MIRROR:=http://deb.debian.org/debian}"
# The real nodes' containerd: trixie's 1.7 (bookworm's 1.6 has no CDI, which the DRA driver
# needs), fetched by containers/kube/containerd.sh. runc stays bookworm's.
: "${SBX_CONTAINERD_SUITE:=trixie}"
: "${SBX_CONTAINERD_VERSION:=1.7.24~ds1-6+deb13u1}"

# Where things live. The cache survives sandbox-down; the state dir does not.
: "${SBX_CACHE:=${XDG_CACHE_HOME:-$HOME/.cache}/slurm-k8s-bridge}"
: "${SBX_STATE:=/var/lib/slurm-k8s-sandbox}"
SBX_RUN="$SBX_STATE/run"       # pid files
SBX_LOG="$SBX_STATE/log"       # one log file per daemon

# The shared "NFS home": same path on the host, in the Slurm rootfs and in pods.
: "${SBX_SHARED_HOME:=/home}"

# Node names. The same names are Slurm nodes and Kubernetes nodes.
: "${SBX_REAL_NODES:=kreal1 kreal2}"     # real kubelets (partition k8s)
: "${SBX_SIM_NODES:=16}"                  # kwok nodes ksim0001.. (partition sim)
: "${SBX_NATIVE_NODES:=native1 native2}"  # ordinary slurmds (partition native)
: "${SBX_GPUS_PER_NODE:=4}"

# Test users, same uid/gid on host and rootfs, each in its own Slurm account.
SBX_USERS="alice:2001 bob:2002"
# ...and all of them in one more group (their supplementary group, native and in pods).
SBX_SHARED_GROUP=sbxproj
SBX_SHARED_GID=3000

# The host's address for pods: slurmrestd and kube-apiserver listen here too (as well as on
# loopback). It sits on lo, so it does not depend on the machine's own network.
: "${SBX_CONTROL_IP:=10.245.0.1}"

# Ports (loopback, and SBX_CONTROL_IP where said).
: "${SBX_APISERVER_PORT:=6443}"
: "${SBX_ETCD_PORT:=2379}"
: "${SBX_SLURMCTLD_PORT:=6817}"
: "${SBX_SLURMDBD_PORT:=6819}"
: "${SBX_SLURMRESTD_PORT:=6820}"
: "${SBX_SLURMD_BASE_PORT:=17000}"

sim_node_names() {
  local i
  for ((i = 1; i <= SBX_SIM_NODES; i++)); do printf 'ksim%04d\n' "$i"; done
}
