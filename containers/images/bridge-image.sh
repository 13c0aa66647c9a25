#!/usr/bin/env bash
# Build the daemon's image without Docker: Debian bookworm (python3 + munge for unmunge) with the
# bridge and its dependencies installed by pip into /opt/slurm-k8s-bridge/lib, as an OCI archive;
# then import it into the given containerd sockets (the sandbox's real nodes by default).
#   containers/images/bridge-image.sh [CONTAINERD_SOCKET...]      (make image)
# Prints the image reference. The base layer is cached; the bridge layer is rebuilt each time.
set -euo pipefail
IMAGES_SRC="$(cd "$(dirname "$0")" && pwd)"
. "$IMAGES_SRC/../sandbox/lib.sh"

VERSION=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$SBX_REPO/bridge/__init__.py")
REF="sandbox.local/slurm-k8s-bridge:$VERSION"
SUITE=bookworm   # its python3 is 3.11, the ABI of the wheels pip picks on this host
BASE_PACKAGES=python3-minimal,python3,munge,ca-certificates
key=$(echo "$SUITE $BASE_PACKAGES $SBX_DEBIAN_MIRROR" | sha256sum | cut -c1-12)
BASE="$SBX_CACHE/images/bridge-base-$key"

python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' ||
  die "pip on this host must be Python 3.11 to fill a bookworm image (it has $(python3 -V))"

if [ ! -f "$BASE/.complete" ]; then
  command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap; }
  say "building the daemon image's base (debootstrap $SUITE, once)"
  rm -rf "$BASE" && mkdir -p "$BASE" "$SBX_CACHE/images/debootstrap-debs"
  debootstrap --variant=minbase --include="$BASE_PACKAGES" --cache-dir="$SBX_CACHE/images/debootstrap-debs" \
    "$SUITE" "$BASE/root" "$SBX_DEBIAN_MIRROR" >"$BASE/debootstrap.log" 2>&1 ||
    { tail -20 "$BASE/debootstrap.log" >&2; die "debootstrap failed"; }
  (cd "$BASE/root" && rm -rf var/cache/apt/* var/lib/apt/lists/* usr/share/doc/* usr/share/man/* \
    usr/share/info/* usr/share/locale/* var/log/* dev/* run/* tmp/*)
  # The daemon's user: no shell, no home, the uid the manifests run it as.
  echo "slurm-k8s-bridge:x:65532:65532:slurm-k8s-bridge:/nonexistent:/usr/sbin/nologin" >>"$BASE/root/etc/passwd"
  echo "slurm-k8s-bridge:x:65532:" >>"$BASE/root/etc/group"
  touch "$BASE/.complete"
fi

work=$(mktemp -d "$SBX_CACHE/images/bridge-image.XXXX")
trap 'rm -rf "$work"' EXIT
cp -a "$BASE/root" "$work/root"
python3 -m pip install -q --no-cache-dir --no-warn-conflicts --root-user-action=ignore --target "$work/root/opt/slurm-k8s-bridge/lib" "$SBX_REPO" >&2
python3 "$IMAGES_SRC/mkimage.py" --rootfs "$work/root" --name "$REF" \
  --entrypoint '["/usr/bin/python3","-m","bridge.cli"]' --cmd '["--help"]' \
  --env PYTHONPATH=/opt/slurm-k8s-bridge/lib --env LANG=C.UTF-8 --env PYTHONDONTWRITEBYTECODE=1 \
  --out "$work/image.tar" >/dev/null
mkdir -p "$SBX_CACHE/images/out" && mv "$work/image.tar" "$SBX_CACHE/images/out/slurm-k8s-bridge-$VERSION.tar"

socks=("$@")
if [ ${#socks[@]} -eq 0 ]; then
  for node in $SBX_REAL_NODES; do socks+=("/run/sbx-kube/$node/containerd.sock"); done
fi
for sock in "${socks[@]}"; do
  [ -S "$sock" ] || die "no containerd at $sock (is the sandbox up?)"
  ctr -n k8s.io --address "$sock" images import "$SBX_CACHE/images/out/slurm-k8s-bridge-$VERSION.tar" >/dev/null
done
echo "$REF"
