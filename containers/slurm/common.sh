# Shared by the Slurm sandbox scripts. Sourced, never run.
. "$(dirname "${BASH_SOURCE[0]}")/../sandbox/lib.sh"

SLURM_DIR="$SBX_REPO/containers/slurm"
SLURM_STATE="$SBX_STATE/slurm"
SLURM_ETC="$SLURM_STATE/etc"
export SLURM_CONF="$SLURM_ETC/slurm.conf"
STEP_GUARD="$SLURM_STATE/spank/slurm_k8s_bridge_guard.so"

# The cached rootfs is bind-mounted here so that every user can reach it
# (host-side Slurm clients load its libraries; the cache may sit under /root).
ROOTFS="$SBX_STATE/rootfs"

# in_ns CMD...: run CMD in the Slurm mount namespace, chrooted into the rootfs.
in_ns() { "$SLURM_DIR/in-ns.sh" "$@"; }

comma_list() { local IFS=,; echo "$*"; }

# Node name lists in hostlist form.
native_hostlist() { comma_list $SBX_NATIVE_NODES; }
real_hostlist() { comma_list $SBX_REAL_NODES; }
sim_hostlist() { printf 'ksim[0001-%04d]' "$SBX_SIM_NODES"; }
native_nodes() { printf '%s\n' $SBX_NATIVE_NODES; }
bridged_nodes() { printf '%s\n' $SBX_REAL_NODES; sim_node_names; }

# slurmd ports: native nodes first, then real, then simulated.
node_port() {
  local name=$1 i=1 n
  for n in $(native_nodes) $(bridged_nodes); do
    [ "$n" = "$name" ] && { echo $((SBX_SLURMD_BASE_PORT + i)); return; }
    i=$((i + 1))
  done
  return 1
}

# start_slurmd NODE: one slurmd for NODE, chrooted like the other daemons.
start_slurmd() {
  mkdir -p "$SLURM_STATE/slurmd/$1"
  start_bg "slurmd-$1" "$SLURM_DIR/in-ns.sh" slurmd -D -N "$1"
}

# start_bridged_slurmd NODE: the same where users' writable places are noexec (in-bridged-ns.sh).
start_bridged_slurmd() {
  mkdir -p "$SLURM_STATE/slurmd/$1"
  start_bg "slurmd-$1" "$SLURM_DIR/in-bridged-ns.sh" slurmd -D -N "$1"
}
