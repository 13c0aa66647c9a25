#!/usr/bin/env bash
# Called by the Slurm half of the sandbox (containers/slurm/up.sh) before slurmctld starts:
# job_submit.lua and the SPANK step guard fail closed without job_submit_bridge.conf, and the
# sandbox's partitions k8s and sim are bridged whether or not the daemon runs. Writes the file
# only when it is missing (make bridge-up writes it from the daemon's own config).
set -euo pipefail
. "$(dirname "$0")/common.sh"
[ -f "$SLURM_ETC/job_submit_bridge.conf" ] && exit 0
mkdir -p "$BRIDGE_STATE"
sandbox_bridge_config "$BRIDGE_STATE/settings-only.toml"
write_job_submit_settings "$BRIDGE_STATE/settings-only.toml"
