#!/usr/bin/env bash
# Build the daemon's image without Docker, as an OCI archive, then import it into the given
# containerd sockets (the sandbox's real nodes by default). Prints the image reference.
#   containers/images/bridge-image.sh [CONTAINERD_SOCKET...]      (make image)
#
# Layers of the recipe:
#   - base (cached): Debian $SBX_DEBIAN_SUITE, the suite the sandbox's Slurm comes from, with
#     python3, munge (munged for the sidecar, unmunge for the daemon) and slurm-client (scontrol,
#     libslurm and its plugins: exactly the sandbox's Slurm version);
#   - the bridge and its dependencies, by pip on this host for the image's Python (wheels only);
#   - pyslurm and the bridge's extension, as containers/pyslurm/build.sh built them in the Slurm
#     rootfs against the same Slurm (checked: same Python, same Slurm package version).
# Needs the sandbox up (the pyslurm build runs in the Slurm rootfs).
set -euo pipefail
IMAGES_SRC="$(cd "$(dirname "$0")" && pwd)"
. "$IMAGES_SRC/../slurm/common.sh"
. "$IMAGES_SRC/../kube/common.sh"   # node_sock

VERSION=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$SBX_REPO/bridge/__init__.py")
REF="sandbox.local/slurm-k8s-bridge:$VERSION"
SUITE=$SBX_DEBIAN_SUITE
BASE_PACKAGES=python3-minimal,python3,munge,slurm-client,ca-certificates
LIB=/opt/slurm-k8s-bridge/lib
key=$( { echo "$SUITE $BASE_PACKAGES $SBX_DEBIAN_MIRROR"; sed -n '/^if \[ ! -f "\$BASE\/.complete" \]/,/^fi$/p' "$0"; } |
  sha256sum | cut -c1-12)
BASE="$SBX_CACHE/images/bridge-base-$key"

if [ ! -f "$BASE/.complete" ]; then
  command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap; }
  say "building the daemon image's base (debootstrap $SUITE, once)"
  rm -rf "$BASE" && mkdir -p "$BASE" "$SBX_CACHE/images/debootstrap-debs-$SUITE"
  debootstrap --variant=minbase --include="$BASE_PACKAGES" --cache-dir="$SBX_CACHE/images/debootstrap-debs-$SUITE" \
    "$SUITE" "$BASE/root" "$SBX_DEBIAN_MIRROR" >"$BASE/debootstrap.log" 2>&1 ||
    { tail -20 "$BASE/debootstrap.log" >&2; die "debootstrap failed"; }
  # No key baked into an image: the pod gets the cluster's from a Secret.
  (cd "$BASE/root" && rm -rf etc/munge/munge.key var/cache/apt/* var/lib/apt/lists/* usr/share/doc/* \
    usr/share/man/* usr/share/info/* usr/share/locale/* var/log/* dev/* run/* tmp/*)
  # The daemon's user: no shell, no home, the uid the manifests run it as.
  echo "slurm-k8s-bridge:x:65532:65532:slurm-k8s-bridge:/nonexistent:/usr/sbin/nologin" >>"$BASE/root/etc/passwd"
  echo "slurm-k8s-bridge:x:65532:" >>"$BASE/root/etc/group"
  touch "$BASE/.complete"
fi
# Bases of earlier recipes are never used again by this checkout.
for old in "$SBX_CACHE"/images/bridge-base-*; do [ "$old" = "$BASE" ] || rm -rf "$old"; done

py_version() { chroot "$1" /usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])'; }
slurm_version() { chroot "$1" dpkg-query -W -f '${Version}' slurm-wlm-basic-plugins; }
image_py=$(py_version "$BASE/root")

# pyslurm, from the Slurm rootfs (built there once; a no-op when current).
"$SBX_REPO/containers/pyslurm/build.sh" >/dev/null
[ "$(py_version "$ROOTFS")" = "$image_py" ] ||
  die "the Slurm rootfs has Python $(py_version "$ROOTFS"), the image base $image_py: rebuild one (rm -rf $BASE)"
[ "$(slurm_version "$ROOTFS")" = "$(slurm_version "$BASE/root")" ] ||
  die "Slurm $(slurm_version "$ROOTFS") in the rootfs, $(slurm_version "$BASE/root") in the image base: rm -rf $BASE"
site="$ROOTFS/opt/pyslurm-venv/lib/python$image_py/site-packages"

# The archive is rebuilt only when something that goes into it changed: this recipe, the base,
# the pyslurm build, or the bridge's sources.
OUT="$SBX_CACHE/images/out/slurm-k8s-bridge-$VERSION.tar"
image_key=$( { cat "$0" "$IMAGES_SRC/mkimage.py" "$ROOTFS"/opt/pyslurm-venv/.built-*; echo "$BASE"
  cd "$SBX_REPO" && find bridge pyproject.toml README.md -type f ! -path '*/__pycache__/*' -print0 |
    sort -z | xargs -0 sha256sum; } | sha256sum | cut -c1-16)
if [ ! -f "$OUT" ] || [ "$(cat "$OUT.key" 2>/dev/null)" != "$image_key" ]; then
  work=$(mktemp -d "$SBX_CACHE/images/bridge-image.XXXX")
  trap 'rm -rf "$work"' EXIT
  cp -a "$BASE/root" "$work/root"
  python3 -m pip wheel -q --no-deps --no-cache-dir -w "$work/wheels" "$SBX_REPO" >&2
  python3 -m pip install -q --no-cache-dir --no-warn-conflicts --root-user-action=ignore \
    --target "$work/root$LIB" --only-binary=:all: --implementation cp \
    --python-version "$image_py" --abi "cp${image_py/./}" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    "$work"/wheels/*.whl >&2
  cp -a "$site"/pyslurm "$site"/pyslurm-*.dist-info "$site"/bridge_pyslurm_ext*.so "$work/root$LIB/"
  rm -rf "$work/root$LIB/bin"
  # Everything imports with the image's own Python and Slurm libraries (pyslurm reads slurm.conf
  # as it loads: give it the sandbox's for the check, then take it away).
  # Without PluginDir: the sandbox's names a directory of the Slurm hosts (their jobacct plugin),
  # and libslurm refuses a PluginDir that does not exist; a client finds its plugins by default.
  grep -v '^PluginDir=' "$SLURM_CONF" >"$work/root/tmp/slurm.conf"
  chroot "$work/root" env -i PYTHONPATH="$LIB" PYTHONDONTWRITEBYTECODE=1 SLURM_CONF=/tmp/slurm.conf /usr/bin/python3 -c \
    'import bridge.manager.cli, aiohttp, kubernetes_asyncio, pyslurm, bridge_pyslurm_ext' ||
    die "the image's Python cannot import the bridge, its dependencies or pyslurm"
  rm -f "$work/root/tmp/slurm.conf"

  python3 "$IMAGES_SRC/mkimage.py" --rootfs "$work/root" --name "$REF" \
    --entrypoint '["/usr/bin/python3","-m","bridge.manager.cli"]' --cmd '["--help"]' \
    --env PYTHONPATH=$LIB --env LANG=C.UTF-8 --env PYTHONDONTWRITEBYTECODE=1 \
    --out "$work/image.tar" >/dev/null
  mkdir -p "$(dirname "$OUT")" && mv "$work/image.tar" "$OUT"
  echo "$image_key" >"$OUT.key"
fi

socks=("$@")
if [ ${#socks[@]} -eq 0 ]; then
  for node in $SBX_REAL_NODES; do socks+=("$(node_sock "$node")"); done
fi
for sock in "${socks[@]}"; do
  [ -S "$sock" ] || die "no containerd at $sock (is the sandbox up?)"
  ctr -n k8s.io --address "$sock" images import "$OUT" >/dev/null
done
echo "$REF"
