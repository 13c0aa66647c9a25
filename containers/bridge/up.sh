#!/usr/bin/env bash
# `make bridge-up`: run the bridge on a running sandbox. Installs job_submit.lua,
# starts one slurmd per bridged node (they only ever run waiters) and the daemon.
# Afterwards plain `sbatch -p k8s ...` from the host shell runs in Kubernetes.
set -euo pipefail
. "$(dirname "$0")/../slurm/common.sh"
BRIDGE_STATE="$SBX_STATE/bridge"
VENV="$SBX_REPO/.venv"
ADMIN_KUBECONFIG="$SBX_STATE/kube/admin.kubeconfig"

# Which Slurm backend the daemon uses: rest (the daemon runs on the host) or pyslurm (it
# runs inside the Slurm rootfs, where pyslurm is built against the running Slurm).
: "${SBX_BRIDGE_BACKEND:=rest}"

[ -f "$SLURM_CONF" ] && [ -f "$ADMIN_KUBECONFIG" ] || die "the sandbox is not up: run make sandbox-up first"
[ -x "$VENV/bin/slurm-k8s-bridge" ] || make -C "$SBX_REPO" -s venv
mkdir -p "$BRIDGE_STATE"

# The waiter runs on the slurmds, inside the rootfs (its own Python): it needs
# only the standard library, so a copy of the package is all it takes.
rm -rf "$BRIDGE_STATE/lib.new" && mkdir -p "$BRIDGE_STATE/lib.new"
cp -r "$SBX_REPO/bridge" "$BRIDGE_STATE/lib.new/"
rm -rf "$BRIDGE_STATE/lib" && mv "$BRIDGE_STATE/lib.new" "$BRIDGE_STATE/lib"
chmod -R a+rX "$BRIDGE_STATE/lib"

# slurmrestd token for the daemon (SlurmUser may see and modify every job).
umask 077
"$SLURM_DIR/cli.sh" scontrol token username=slurm lifespan=604800 >"$BRIDGE_STATE/slurm.jwt.new"
mv "$BRIDGE_STATE/slurm.jwt.new" "$BRIDGE_STATE/slurm.jwt"
umask 022

if [ "$SBX_BRIDGE_BACKEND" = pyslurm ]; then
  "$SBX_REPO/containers/pyslurm/build.sh" >/dev/null
  unmunge="unmunge"                          # the daemon runs in the rootfs, beside munged
  daemon=("$SLURM_DIR/in-ns.sh" env "PYTHONPATH=$BRIDGE_STATE/lib" /opt/pyslurm-venv/bin/python -m bridge.cli)
else
  unmunge="$SLURM_DIR/cli.sh unmunge"       # the host has no munge of its own: the rootfs's
  daemon=("$VENV/bin/slurm-k8s-bridge")
fi

cat >"$BRIDGE_STATE/config.toml" <<TOML
# Bridge config for the sandbox, written by containers/bridge/up.sh.
cluster = "sandbox"
namespace = "slurm-jobs"
termination_grace_s = 5
# The sandbox has no registry: a missing image never appears, fail fast.
start_failure_grace_s = 10

[slurm]
backend = "$SBX_BRIDGE_BACKEND"
url = "http://127.0.0.1:$SBX_SLURMRESTD_PORT"
token_file = "$BRIDGE_STATE/slurm.jwt"
user = "slurm"
poll_interval_s = 0.2

[kubernetes]
kubeconfig = "$ADMIN_KUBECONFIG"

[api]
listen = "127.0.0.1:${SBX_BRIDGE_PORT:-8470}"

[waiter]
unmunge_command = "$unmunge"
# Straight to the waiter module, without site and argparse: its start-up is job start latency.
attach_command = "/usr/bin/env PYTHONPATH=$BRIDGE_STATE/lib /usr/bin/python3 -S -m bridge.waiter"

[partitions.k8s]
# No default image: jobs must say "#K8S image=...".
image_pull_policy = "IfNotPresent"
# slurm.conf gives each real node 8 CPUs on a 2-core VM (see containers/slurm/etc).
cpu_request_fraction = 0.1
[[partitions.k8s.volumes]]
name = "home"
host_path = "$SBX_SHARED_HOME"

[partitions.sim]
default_image = "sandbox.local/busybox:1"
[[partitions.sim.volumes]]
name = "home"
host_path = "$SBX_SHARED_HOME"
TOML

# job_submit.lua and its settings, derived from the same config.
"$VENV/bin/slurm-k8s-bridge" job-submit-conf -c "$BRIDGE_STATE/config.toml" >"$SLURM_ETC/job_submit_bridge.conf"
cp "$SBX_REPO/deploy/slurm/job_submit.lua" "$SLURM_ETC/job_submit.lua"

start_bg bridge "${daemon[@]}" run -c "$BRIDGE_STATE/config.toml"
for node in $(bridged_nodes); do start_slurmd "$node"; done

ready() { curl -fsS "http://127.0.0.1:${SBX_BRIDGE_PORT:-8470}/readyz" >/dev/null; }
wait_for "the bridge daemon (log: $SBX_LOG/bridge.log)" 30 ready
for node in $(bridged_nodes); do
  wait_for "slurmd $node" 30 sh -c "'$SLURM_DIR/cli.sh' sinfo -h -n $node -o %T | grep -qE '^(idle|mixed|allocated)'"
done
say "bridge is up: sbatch -p k8s (real nodes) or -p sim (kwok nodes); log $SBX_LOG/bridge.log"
