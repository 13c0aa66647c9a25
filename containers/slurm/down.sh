#!/usr/bin/env bash
# Stop the Slurm half of the sandbox. State (accounting DB, job state) is kept
# in $SBX_STATE until `make sandbox-down` removes it.
set -euo pipefail
. "$(dirname "$0")/common.sh"
for pidfile in "$SBX_RUN"/slurmd-*.pid; do
  [ -e "$pidfile" ] || continue
  stop_bg "$(basename "$pidfile" .pid)"
done
stop_bg slurmrestd
stop_bg slurmctld
stop_bg slurmdbd
stop_bg mariadb 30
stop_bg munged
# Killing the holder drops the private mount namespace and every mount in it.
stop_bg slurm-ns
while mountpoint -q "$ROOTFS"; do umount "$ROOTFS" || break; done   # stacked mounts too
if [ -L /run/munge ]; then rm -f /run/munge; fi
