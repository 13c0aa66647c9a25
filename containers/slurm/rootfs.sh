#!/usr/bin/env bash
# Build (once) the Debian rootfs that holds Slurm 26.05, munge and MariaDB.
# The result is cached in $SBX_CACHE/slurm-rootfs-<key>; the key changes when
# this recipe changes, so editing the package list rebuilds it.
set -euo pipefail
. "$(dirname "$0")/../sandbox/lib.sh"

PACKAGES=(
  slurmctld slurmd slurmdbd slurmrestd slurm-client slurm-wlm-jwt-plugin libslurm-dev
  munge mariadb-server
  python3 python3-venv python3-dev gcc pkg-config ca-certificates
  procps iproute2 less
)

key=$( { cat "$0"; echo "$SBX_DEBIAN_SUITE $SBX_DEBIAN_MIRROR"; } | sha256sum | cut -c1-12)
ROOTFS="$SBX_CACHE/slurm-rootfs-$key"

if [ -f "$ROOTFS/.complete" ]; then
  echo "$ROOTFS"
  exit 0
fi

command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap >&2; }
ensure_dirs
rm -rf "$ROOTFS.tmp"
say "debootstrap $SBX_DEBIAN_SUITE into $ROOTFS (one time, ~1 min)"
debootstrap --variant=minbase "$SBX_DEBIAN_SUITE" "$ROOTFS.tmp" "$SBX_DEBIAN_MIRROR" >&2

# The archive served here is a dated snapshot: its Release files look expired.
echo 'Acquire::Check-Valid-Until "false";' >"$ROOTFS.tmp/etc/apt/apt.conf.d/99no-valid-until"
# Package traffic passes through a CA only the host trusts; pip in the rootfs needs it.
mkdir -p "$ROOTFS.tmp/usr/local/share/ca-certificates"
cp /etc/ssl/certs/ca-certificates.crt "$ROOTFS.tmp/etc/host-ca-bundle.crt"
# minbase has no /etc/hosts; slurmctld and munged need localhost and the host's name.
printf '127.0.0.1 localhost\n127.0.1.1 %s\n' "$(hostname)" >"$ROOTFS.tmp/etc/hosts"
# Daemons must not be started by package scripts inside the chroot.
printf '#!/bin/sh\nexit 101\n' >"$ROOTFS.tmp/usr/sbin/policy-rc.d"
chmod +x "$ROOTFS.tmp/usr/sbin/policy-rc.d"

mount -t proc proc "$ROOTFS.tmp/proc"
trap 'umount "$ROOTFS.tmp/proc" 2>/dev/null || true' EXIT
say "installing Slurm, munge, MariaDB into the rootfs"
chroot "$ROOTFS.tmp" apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive chroot "$ROOTFS.tmp" apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >&2
# Slurm 26.05's mysql plugin fails on sid's libmariadb 3.4 ("5027 Number of
# columns in result (=1) set execeeds maxmimum allowed number of columns (=0)"
# on its first query); bookworm's libmariadb3 (same soname) works.
echo "deb $SBX_DEBIAN_MIRROR bookworm main" >"$ROOTFS.tmp/etc/apt/sources.list.d/bookworm.list"
chroot "$ROOTFS.tmp" apt-get update -qq >&2
old_libmariadb=$(chroot "$ROOTFS.tmp" apt-cache policy libmariadb3 | grep -oE '1:10\.11[^ ]+' | head -1)
DEBIAN_FRONTEND=noninteractive chroot "$ROOTFS.tmp" apt-get install -y -qq --allow-downgrades "libmariadb3=$old_libmariadb" >&2
chroot "$ROOTFS.tmp" apt-mark hold libmariadb3 >&2
chroot "$ROOTFS.tmp" apt-get clean
umount "$ROOTFS.tmp/proc"
trap - EXIT

touch "$ROOTFS.tmp/.complete"
mv "$ROOTFS.tmp" "$ROOTFS"
echo "$ROOTFS"
