#!/usr/bin/env bash
# Build the sandbox's container images from Debian packages, without Docker,
# as OCI archives cached in $SBX_CACHE/images/<recipe-hash>/, then import them
# into the given containerd sockets (skipped when already there).
#
#   sandbox.local/busybox:1        busybox-static, applets linked in /bin etc.; its PATH starts with
#                                  /opt/busybox-image/bin, as a conda or CUDA image's starts with its
#                                  own directories (image-path-probe there says it was found)
#   sandbox.local/debian-python:12 debootstrap minbase bookworm + python3 (its whole standard library)
#   sandbox.local/pause:1          pod sandbox ("pause") image, busybox layer
#
# There is no registry: pods must say imagePullPolicy: IfNotPresent (or Never).
# Usage: containers/images/build.sh [CONTAINERD_SOCKET...]
set -euo pipefail
IMAGES_SRC="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=../sandbox/lib.sh
. "$IMAGES_SRC/../sandbox/lib.sh"

PY_SUITE=bookworm   # Debian 12, hence the tag :12
recipe=$(cat "$IMAGES_SRC/build.sh" "$IMAGES_SRC/mkimage.py" | sha256sum | cut -c1-12)
IMG_DIR="$SBX_CACHE/images/$recipe"
DEB_DIR="$SBX_CACHE/images/debs"
mkdir -p "$IMG_DIR" "$DEB_DIR"

# image list: file-stem reference
IMAGES="busybox-1:sandbox.local/busybox:1 pause-1:sandbox.local/pause:1 debian-python-12-stdlib:sandbox.local/debian-python:12"

apt_ready=0
need_cmd() { # need_cmd CMD PACKAGE
  command -v "$1" >/dev/null && return 0
  apt_update_once
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
}
apt_update_once() {
  [ "$apt_ready" = 1 ] && return 0
  apt-get update -qq
  apt_ready=1
}

mkimage() { python3 "$IMAGES_SRC/mkimage.py" "$@"; }

build_busybox() { # also the pause image: same layer, other entrypoint
  local tmp deb a
  ls "$DEB_DIR"/busybox-static_*.deb >/dev/null 2>&1 ||
    (cd "$DEB_DIR" && { apt-get download busybox-static 2>/dev/null ||
      { apt_update_once && apt-get download busybox-static; }; })
  # shellcheck disable=SC2012 # Debian file names
  deb=$(ls "$DEB_DIR"/busybox-static_*.deb | tail -1)
  tmp=$(mktemp -d "$IMG_DIR/busybox.XXXX")
  dpkg-deb -x "$deb" "$tmp/deb"
  mkdir -p "$tmp/root"/{bin,sbin,usr/bin,usr/sbin,etc,tmp,root,home,proc,sys,dev}
  chmod 1777 "$tmp/root/tmp"
  cp "$tmp/deb/bin/busybox" "$tmp/root/bin/busybox"
  for a in $("$tmp/root/bin/busybox" --list-full); do
    [ "$a" = bin/busybox ] || ln -sf /bin/busybox "$tmp/root/$a"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$tmp/root/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$tmp/root/etc/group"
  mkdir -p "$tmp/root/opt/busybox-image/bin"
  printf '#!/bin/sh\necho "image-path-probe: found on the image'"'"'s PATH"\n' \
    >"$tmp/root/opt/busybox-image/bin/image-path-probe"
  chmod 755 "$tmp/root/opt/busybox-image/bin/image-path-probe"
  mkimage --rootfs "$tmp/root" --name sandbox.local/busybox:1 --cmd '["sh"]' \
    --env PATH=/opt/busybox-image/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --out "$IMG_DIR/busybox-1.tar" >"$IMG_DIR/busybox-1.digest"
  # pause: PID 1 of each pod; sh reaps orphans while waiting, exits on TERM.
  mkimage --rootfs "$tmp/root" --name sandbox.local/pause:1 \
    --entrypoint '["/bin/sh","-c","trap \"exit 0\" TERM INT; while :; do sleep 2147483647 & wait; done"]' \
    --out "$IMG_DIR/pause-1.tar" >"$IMG_DIR/pause-1.digest"
  rm -rf "$tmp"
}

build_debian_python() {
  local tmp
  need_cmd debootstrap debootstrap
  tmp=$(mktemp -d "$IMG_DIR/debian-python.XXXX")
  mkdir -p "$SBX_CACHE/images/debootstrap-debs"
  # python3, not python3-minimal: a researcher's script imports shutil, json, subprocess... as on
  # the hosts (submitit's job does).
  debootstrap --variant=minbase --include=python3 \
    --cache-dir="$SBX_CACHE/images/debootstrap-debs" \
    "$PY_SUITE" "$tmp/root" "$SBX_DEBIAN_MIRROR" >"$tmp/debootstrap.log" 2>&1 ||
    { tail -20 "$tmp/debootstrap.log" >&2; die "debootstrap failed"; }
  # Keep the image small: docs, man pages, locales and apt caches go.
  (cd "$tmp/root" && rm -rf var/cache/apt/* var/lib/apt/lists/* usr/share/doc/* \
    usr/share/man/* usr/share/info/* usr/share/locale/* var/log/* dev/* run/* tmp/* \
    var/cache/debconf/*-old var/lib/dpkg/*-old)
  mkimage --rootfs "$tmp/root" --name sandbox.local/debian-python:12 --cmd '["python3"]' \
    --env LANG=C.UTF-8 --out "$IMG_DIR/debian-python-12-stdlib.tar" >"$IMG_DIR/debian-python-12-stdlib.digest"
  rm -rf "$tmp"
}

start=$SECONDS
need_cmd python3 python3-minimal
[ -s "$IMG_DIR/busybox-1.digest" ] && [ -s "$IMG_DIR/pause-1.digest" ] || { say "building busybox and pause images"; build_busybox; }
[ -s "$IMG_DIR/debian-python-12-stdlib.digest" ] || { say "building debian-python image (debootstrap)"; build_debian_python; }
[ $((SECONDS - start)) -gt 1 ] && say "images built in $((SECONDS - start))s into $IMG_DIR"

# Import into each containerd whose digest differs (or is missing).
for sock in "$@"; do
  have=$(ctr -n k8s.io --address "$sock" images ls 2>/dev/null | awk 'NR>1 {print $1, $3}')
  for img in $IMAGES; do
    stem=${img%%:*} ref=${img#*:}
    want=$(cat "$IMG_DIR/$stem.digest")
    if ! grep -qx "$ref $want" <<<"$have"; then
      ctr -n k8s.io --address "$sock" images import "$IMG_DIR/$stem.tar" >/dev/null ||
        die "import of $ref into $sock failed"
    fi
  done
done
