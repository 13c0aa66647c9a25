#!/usr/bin/env bash
# `make bridge-down`: stop the bridge, whichever way it runs (daemon on the host, or the Helm
# release of make bridge-deploy), and the bridged nodes' slurmds; jobs submitted to bridged
# partitions afterwards stay pending.
set -euo pipefail
. "$(dirname "$0")/common.sh"
. "$SBX_REPO/containers/helm/common.sh"   # HELM, hc
# job_submit_bridge.conf stays: bridged partitions stay bridged while the daemon is down (their
# jobs are still checked and wait), and job_submit.lua refuses every job without it.
stop_bg bridge 15
if [ -f "$ADMIN_KUBECONFIG" ]; then
  deployed=0
  if [ -x "$HELM" ] && hc status slurm-k8s-bridge -n "$BRIDGE_NAMESPACE" >/dev/null 2>&1; then
    # Everything the chart made (Deployment, Service, ConfigMaps, Secrets, ServiceAccount, the
    # Roles and bindings here and in the job namespace, the ClusterRole and its binding) and the
    # release record. The job namespace stays (jobs may still run there).
    hc uninstall slurm-k8s-bridge -n "$BRIDGE_NAMESPACE" --wait --timeout 120s >/dev/null
    deployed=1
  elif kc_deployed; then
    # A Deployment made by kubectl apply -k (before the chart): its objects by name.
    kc delete clusterrolebinding,clusterrole slurm-k8s-bridge-nodes --ignore-not-found >/dev/null
    kc -n slurm-jobs delete rolebinding,role slurm-k8s-bridge-jobs --ignore-not-found >/dev/null
    deployed=1
  fi
  if [ "$deployed" = 1 ]; then
    # helm --create-namespace made the namespace outside the release; the Lease is the daemon's
    # own (no holder left: the next daemon, host or Deployment, takes a fresh one).
    kc delete namespace "$BRIDGE_NAMESPACE" --ignore-not-found --wait=true --timeout=120s >/dev/null
    config="$BRIDGE_STATE/deploy/config.toml"
    cluster=$(sed -n 's/^cluster = "\(.*\)"$/\1/p' "$config" 2>/dev/null || true)
    job_namespace=$(sed -n 's/^namespace = "\(.*\)"$/\1/p' "$config" 2>/dev/null || true)
    kc -n "${job_namespace:-slurm-jobs}" delete lease "slurm-k8s-bridge-${cluster:-sandbox}" --ignore-not-found >/dev/null
    # The values it was installed with hold the JWT and the munge key.
    rm -rf "$BRIDGE_STATE/deploy"
    # The release took its admission policies along: the host's (the same ones) hold the managed
    # namespaces' pods again while no bridge runs.
    apply_workload_admission
  fi
fi
for node in $(bridged_nodes); do stop_bg "slurmd-$node" & done
wait
