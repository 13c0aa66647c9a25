#!/usr/bin/env bash
# Build sandbox.local/debian-mpi:12 (debootstrap minbase bookworm + Open MPI + mpi4py, from
# Debian's archive) for the MPI example (docs/examples/mpi_hello.sh), cached by the hash of this
# recipe, and import it into the given containerd sockets where their copy differs. Its own
# recipe, so that changing it rebuilds no other image.
# Usage: containers/images/mpi.sh [CONTAINERD_SOCKET...]
set -euo pipefail
IMAGES_SRC="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=../sandbox/lib.sh
. "$IMAGES_SRC/../sandbox/lib.sh"

REF=sandbox.local/debian-mpi:12
hash=$(cat "$IMAGES_SRC/mpi.sh" "$IMAGES_SRC/mkimage.py" | sha256sum | cut -c1-12)
dir="$SBX_CACHE/images/mpi-$hash"
if ! [ -s "$dir/mpi.digest" ]; then
  command -v debootstrap >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
  say "building $REF (debootstrap, openmpi-bin, python3-mpi4py)"
  mkdir -p "$dir" "$SBX_CACHE/images/debootstrap-debs"
  tmp=$(mktemp -d "$dir/build.XXXX")
  debootstrap --variant=minbase --include=python3-minimal,python3-mpi4py,openmpi-bin \
    --cache-dir="$SBX_CACHE/images/debootstrap-debs" bookworm "$tmp/root" "$SBX_DEBIAN_MIRROR" \
    >"$tmp/debootstrap.log" 2>&1 || { tail -20 "$tmp/debootstrap.log" >&2; die "debootstrap failed"; }
  # Keep the image smaller: docs, man pages, locales, headers and apt caches go.
  (cd "$tmp/root" && rm -rf var/cache/apt/* var/lib/apt/lists/* usr/share/doc/* usr/share/man/* \
    usr/share/info/* usr/share/locale/* var/log/* dev/* run/* tmp/* usr/include/* \
    var/cache/debconf/*-old var/lib/dpkg/*-old)
  python3 "$IMAGES_SRC/mkimage.py" --rootfs "$tmp/root" --name "$REF" --cmd '["python3"]' \
    --env LANG=C.UTF-8 --out "$dir/mpi.tar" >"$dir/mpi.digest.new"
  mv "$dir/mpi.digest.new" "$dir/mpi.digest"
  rm -rf "$tmp"
fi
want=$(cat "$dir/mpi.digest")
for sock in "$@"; do
  if ! ctr -n k8s.io --address "$sock" images ls 2>/dev/null | awk 'NR>1 {print $1, $3}' | grep -qx "$REF $want"; then
    ctr -n k8s.io --address "$sock" images import "$dir/mpi.tar" >/dev/null || die "import of $REF into $sock failed"
  fi
done
