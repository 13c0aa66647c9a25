#!/usr/bin/env bash
# Print the state of each Slurm daemon and the cluster's partitions.
set -uo pipefail
. "$(dirname "$0")/common.sh"
rc=0
for name in slurm-ns munged mariadb slurmdbd slurmctld slurmrestd $(native_nodes | sed 's/^/slurmd-/'); do
  if is_running "$name"; then printf '  %-22s running (pid %s)\n' "$name" "$(cat "$SBX_RUN/$name.pid")"
  else printf '  %-22s STOPPED\n' "$name"; rc=1; fi
done
if is_running slurmctld; then "$SLURM_DIR/cli.sh" sinfo -o '  %10P %5a %6D %8t %N %G' || rc=1; fi
exit $rc
