#!/usr/bin/env bash
# in-bridged-ns.sh CMD...: run CMD as in-ns.sh does, but in a mount namespace of its own below the
# sandbox's, where every place a user can write is mounted noexec: the shared home, /tmp,
# /var/tmp and /dev/shm. The bridged slurmds run here. Their host must never run a user's
# program; the SPANK guard is the barrier (a user's step execs only the bridge's proxy, and its
# slurmstepd nothing after that, so no --task-epilog), these mounts are defence in depth. In
# production the same comes from the slurmd unit (deploy/systemd: NoExecPaths=).
set -euo pipefail
. "$(dirname "$0")/common.sh"
holder=$(cat "$SBX_RUN/slurm-ns.pid")
# unshare without --fork execs: the pid stays the daemon's (start_bg's pid file names it).
exec nsenter -t "$holder" -m -- unshare --mount --propagation private -- bash -c '
  set -euo pipefail
  root=$1 home=$2 conf=$3; shift 3
  mountpoint -q "$root/var/tmp" || mount --bind "$root/var/tmp" "$root/var/tmp"
  for place in "$root$home" "$root/tmp" "$root/var/tmp" "$root/dev/shm"; do
    mount -o remount,bind,noexec,nosuid,nodev "$place"
  done
  exec chroot "$root" env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    SLURM_CONF="$conf" "$@"' in-bridged-ns "$ROOTFS" "$SBX_SHARED_HOME" "$SLURM_CONF" "$@"
