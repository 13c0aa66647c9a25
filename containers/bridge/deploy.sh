#!/usr/bin/env bash
# `make bridge-deploy`: run the bridge on the sandbox as production runs it in a cluster: the
# Deployment of deploy/kubernetes (2 replicas, leader election) with the sandbox overlay, from the
# image `make image` builds, on the real nodes. Writes the overlay's generated/ (config, JWT,
# munge key), applies it, waits for the leader, then sets up Slurm's side as bridge-up does.
#   SBX_BRIDGE_BACKEND=pyslurm: the daemon uses the image's pyslurm (libslurm talks to slurmctld
#   with munge, so it runs as SlurmUser) instead of slurmrestd.
set -euo pipefail
. "$(dirname "$0")/common.sh"
: "${SBX_BRIDGE_BACKEND:=rest}"

require_sandbox
if is_running bridge; then die "the bridge runs on the host (make bridge-up); make bridge-down first"; fi
"$SBX_REPO/containers/images/bridge-image.sh" >/dev/null
install_waiter
ensure_scratch

# Waiters on the slurmds reach the leader through the Service (kube-proxy on the host).
service_ip=$(sed -n 's/^ *clusterIP: *//p' "$OVERLAY/fixed-service-ip.yaml")
generated="$OVERLAY/generated"
mkdir -p "$generated" && chmod 700 "$generated"
mint_jwt "$generated/slurm.jwt"
(umask 077 && cp "$SBX_STATE/munge/munge.key" "$generated/munge.key")
# slurm.conf as pods see it, for libslurm in the pod: slurmctld at the host's control address,
# munged at the sidecar's socket.
sed -e "s/^SlurmctldHost=\([^(]*\)(127.0.0.1)/SlurmctldHost=\1($SBX_CONTROL_IP)/" \
  -e "s|^AuthInfo=socket=.*|AuthInfo=socket=/run/munge/munge.socket.2|" "$SLURM_CONF" >"$generated/slurm.conf"
grep -q "^SlurmctldHost=.*($SBX_CONTROL_IP)" "$generated/slurm.conf" || die "cannot point slurm.conf's SlurmctldHost at $SBX_CONTROL_IP"
# Who the daemon runs as: its own unprivileged uid with slurmrestd (the JWT carries SlurmUser's
# rights); SlurmUser itself with pyslurm (slurmctld trusts the munge uid).
if [ "$SBX_BRIDGE_BACKEND" = pyslurm ]; then run_as=$(in_ns id -u slurm); else run_as=65532; fi
cat >"$generated/run-as.yaml" <<YAML
apiVersion: apps/v1
kind: Deployment
metadata: {name: slurm-k8s-bridge, namespace: slurm-k8s-bridge}
spec:
  template:
    spec:
      securityContext: {runAsUser: $run_as, runAsGroup: $run_as, fsGroup: $run_as}
YAML
{
  echo "# Bridge config for the sandbox's Deployment, written by containers/bridge/deploy.sh."
  job_settings_config
  cat <<TOML

[slurm]
backend = "$SBX_BRIDGE_BACKEND"
# slurmrestd as pods see the host.
url = "http://$SBX_CONTROL_IP:$SBX_SLURMRESTD_PORT"
token_file = "/etc/slurm-k8s-bridge/secret/slurm.jwt"
user = "slurm"
poll_interval_s = 0.2

# No [kubernetes] table: in-cluster, with the ServiceAccount's token.

[api]
listen = "0.0.0.0:8470"

[waiter]
# unmunge talks to the munged sidecar (the default socket).
attach_command = "$WAITER_COMMAND"
api_url = "http://$service_ip:8470"

TOML
  partitions_config
} >"$generated/config.toml"

existed=0
kc_deployed && existed=1
kc apply -k "$OVERLAY" >/dev/null
# A re-deploy picks up a new config, JWT or image (the overlay's names carry no content hash).
[ "$existed" = 1 ] && kc -n "$BRIDGE_NAMESPACE" rollout restart deployment/slurm-k8s-bridge >/dev/null
kc -n "$BRIDGE_NAMESPACE" rollout status deployment/slurm-k8s-bridge --timeout=120s >/dev/null ||
  die "the Deployment did not come up: kubectl -n $BRIDGE_NAMESPACE describe pods; kubectl -n $BRIDGE_NAMESPACE logs -l app.kubernetes.io/name=slurm-k8s-bridge"
ready() { curl -fsS --max-time 2 "http://$service_ip:8470/readyz" >/dev/null; }
wait_for "the leader behind http://$service_ip:8470" 60 ready
slurm_side_up "$generated/config.toml"
say "bridge is deployed: kubectl -n $BRIDGE_NAMESPACE get pods; sbatch -p k8s ..."
