#!/usr/bin/env bash
# `make bridge-up`: run the bridge on a running sandbox. Installs job_submit.lua,
# starts one slurmd per bridged node (they only ever run waiters) and the daemon.
# Afterwards plain `sbatch -p k8s ...` from the host shell runs in Kubernetes.
set -euo pipefail
. "$(dirname "$0")/common.sh"
. "$SBX_REPO/containers/helm/common.sh"   # HELM, hc

# Which Slurm backend the daemon uses: rest (the daemon runs on the host) or pyslurm (it
# runs inside the Slurm rootfs, where pyslurm is built against the running Slurm).
: "${SBX_BRIDGE_BACKEND:=rest}"

require_sandbox
if kc_deployed 2>/dev/null; then die "the bridge runs as the Deployment (make bridge-deploy); make bridge-down first"; fi
install_waiter
ensure_scratch
ensure_step_key
# The policies first: a namespace is held for Slurm from the moment it is labelled.
apply_workload_admission
ensure_managed_namespaces
mint_jwt "$BRIDGE_STATE/slurm.jwt"

if [ "$SBX_BRIDGE_BACKEND" = pyslurm ]; then
  "$SBX_REPO/containers/pyslurm/build.sh" >/dev/null
  unmunge="unmunge"                          # the daemon runs in the rootfs, beside munged
  daemon=("$SLURM_DIR/in-ns.sh" env "PYTHONPATH=$BRIDGE_STATE/lib" /opt/pyslurm-venv/bin/python -m bridge.manager.cli)
else
  unmunge="$SLURM_DIR/cli.sh unmunge"       # the host has no munge of its own: the rootfs's
  daemon=("$VENV/bin/slurm-k8s-bridge")
fi

# The address munged puts into the credentials made on this host (where the bridged slurmds run).
encode_ip=$(echo | "$SLURM_DIR/cli.sh" munge | "$SLURM_DIR/cli.sh" unmunge --keys=encode_host |
  sed -n 's/^ENCODE_HOST:.*(\(.*\)).*$/\1/p')
slurmd_hosts=${encode_ip:+\"$encode_ip\"}
{
  echo "# Bridge config for the sandbox, written by containers/bridge/up.sh."
  job_settings_config
  cat <<TOML

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
attach_command = "$WAITER_COMMAND"
# Signs the steps of srun in the pods; the SPANK guard reads the same file.
step_key_file = "$STEP_KEY"
# Waiter requests only from the bridged slurmds' host (here: this one, as munged names it).
slurmd_hosts = [$slurmd_hosts]

TOML
  partitions_config
  workloads_config
} >"$BRIDGE_STATE/config.toml"

start_bg bridge "${daemon[@]}" run -c "$BRIDGE_STATE/config.toml"
ready() { curl -fsS "http://127.0.0.1:${SBX_BRIDGE_PORT:-8470}/readyz" >/dev/null; }
wait_for "the bridge daemon (log: $SBX_LOG/bridge.log)" 30 ready
slurm_side_up "$BRIDGE_STATE/config.toml"
say "bridge is up: sbatch -p k8s (real nodes) or -p sim (kwok nodes); log $SBX_LOG/bridge.log"
