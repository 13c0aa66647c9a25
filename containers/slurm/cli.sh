#!/usr/bin/env bash
# cli.sh CMD ARGS...: run a Slurm client (sbatch, sacct, ...) on the host, as
# the calling user, with the rootfs's own loader and libraries. No chroot and
# no privileges are needed, so `runuser -u alice -- sbatch` works.
set -euo pipefail
. "$(dirname "$0")/../sandbox/settings.sh"
cmd=$1; shift
root="$SBX_STATE/rootfs"
export SLURM_CONF="$SBX_STATE/slurm/etc/host/slurm.conf"
exec "$root/usr/lib64/ld-linux-x86-64.so.2" \
  --library-path "$root/usr/lib/x86_64-linux-gnu/slurm-wlm:$root/usr/lib/x86_64-linux-gnu" \
  --argv0 "$cmd" "$root/usr/bin/$cmd" "$@"
