#!/usr/bin/env bash
# in-ns.sh CMD...: run CMD chrooted into the Slurm rootfs, inside the sandbox's
# private mount namespace (held open by the slurm-ns process). The exec chain
# keeps the pid, so start_bg's pid file names the daemon itself.
set -euo pipefail
. "$(dirname "$0")/common.sh"
holder=$(cat "$SBX_RUN/slurm-ns.pid")
# The rootfs's own PATH: a caller's (e.g. after `eval "$(make -s sandbox-env)"`) names host wrappers.
exec nsenter -t "$holder" -m -- chroot "$ROOTFS" env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  SLURM_CONF="$SLURM_CONF" "$@"
