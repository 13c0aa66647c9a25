#!/usr/bin/env bash
# `make bridge-down`: stop the bridge, whichever way it runs (daemon on the host, or the
# Deployment), and the bridged nodes' slurmds; jobs submitted to bridged partitions afterwards
# stay pending.
set -euo pipefail
. "$(dirname "$0")/common.sh"
# job_submit_bridge.conf stays: bridged partitions stay bridged while the daemon is down (their
# jobs are still rewritten and wait), and job_submit.lua refuses every job without it.
stop_bg bridge 15
if [ -f "$ADMIN_KUBECONFIG" ] && kc_deployed; then
  # Its namespace, and what it holds outside: the job pods' namespace stays (jobs may still run).
  kc delete namespace "$BRIDGE_NAMESPACE" --wait=true --timeout=120s >/dev/null
  kc delete clusterrolebinding,clusterrole slurm-k8s-bridge-nodes --ignore-not-found >/dev/null
  kc -n slurm-jobs delete rolebinding,role slurm-k8s-bridge-jobs --ignore-not-found >/dev/null
fi
for node in $(bridged_nodes); do stop_bg "slurmd-$node" & done
wait
