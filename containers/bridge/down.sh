#!/usr/bin/env bash
# `make bridge-down`: stop the daemon and the bridged nodes' slurmds; jobs
# submitted to bridged partitions afterwards stay pending.
set -euo pipefail
. "$(dirname "$0")/../slurm/common.sh"
rm -f "$SLURM_ETC/job_submit_bridge.conf"   # job_submit.lua lets everything through without it
stop_bg bridge 15
for node in $(bridged_nodes); do stop_bg "slurmd-$node" & done
wait
