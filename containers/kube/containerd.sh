#!/usr/bin/env bash
# Fetch the real nodes' containerd into $KUBE_CONTAINERD_BIN (= $SBX_CACHE/bin/containerd-<version>):
# containerd, containerd-shim-runc-v2 and ctr from Debian trixie's containerd package
# ($SBX_CONTAINERD_VERSION). Why not the host's: bookworm ships containerd 1.6, which has no
# CDI, and the DRA driver hands its devices to containers through CDI (1.7 reads the cri
# plugin's enable_cdi / cdi_spec_dirs). runc stays the host's (bookworm's).
# The .deb comes from Debian's archive through apt with a private state (own sources.list, lists
# and cache; signature checked with Debian's archive keyring), so the host's apt setup is left
# as it is. A no-op when the binaries are there (the cache survives sandbox-down).
# Prints the directory on stdout.
# Usage: containers/kube/containerd.sh [--force]
set -euo pipefail
. "$(dirname "$0")/common.sh"

want="containerd containerd-shim-runc-v2 ctr"
have() { local b; for b in $want; do [ -x "$KUBE_CONTAINERD_BIN/$b" ] || return 1; done; }
if [ "${1:-}" != --force ] && have; then
  echo "$KUBE_CONTAINERD_BIN"
  exit 0
fi

keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -f "$keyring" ] || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debian-archive-keyring >/dev/null; }
mkdir -p "$SBX_CACHE/bin"
tmp=$(mktemp -d "$SBX_CACHE/bin/containerd.tmp.XXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial"
echo "deb [signed-by=$keyring] $SBX_DEBIAN_MIRROR $SBX_CONTAINERD_SUITE main" >"$tmp/sources.list"
# _apt (apt's download user) may not enter the cache: download as root, into our own dirs only.
apt_private() {
  apt-get -q -o Dir::Etc::sourcelist="$tmp/sources.list" -o Dir::Etc::sourceparts=/dev/null \
    -o Dir::State::lists="$tmp/lists" -o Dir::Cache="$tmp/cache" -o Dir::State::status=/var/lib/dpkg/status \
    -o APT::Sandbox::User=root -o Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false "$@"
}
say "fetching containerd $SBX_CONTAINERD_VERSION from Debian $SBX_CONTAINERD_SUITE (once; cached in $KUBE_CONTAINERD_BIN)"
apt_private update >"$tmp/apt.log" 2>&1 || { cat "$tmp/apt.log" >&2; die "apt-get update ($SBX_CONTAINERD_SUITE) failed"; }
(cd "$tmp" && apt_private download "containerd=$SBX_CONTAINERD_VERSION") >>"$tmp/apt.log" 2>&1 || {
  cat "$tmp/apt.log" >&2
  die "containerd=$SBX_CONTAINERD_VERSION is not in $SBX_CONTAINERD_SUITE (any more?); it has: $(apt_private policy containerd 2>/dev/null | sed -n 's/^ *Candidate: //p'); set SBX_CONTAINERD_VERSION in containers/sandbox/settings.sh"
}
dpkg-deb -x "$tmp"/containerd_*.deb "$tmp/x"
mkdir -p "$tmp/bin"
for b in $want; do cp "$tmp/x/usr/bin/$b" "$tmp/bin/"; done
"$tmp/bin/containerd" --version | grep -qF "$SBX_CONTAINERD_VERSION" || die "unexpected $("$tmp/bin/containerd" --version)"
rm -rf "$KUBE_CONTAINERD_BIN"
mv "$tmp/bin" "$KUBE_CONTAINERD_BIN"
# Other versions are never used again by this checkout.
for old in "$SBX_CACHE"/bin/containerd-*; do
  [ "$old" = "$KUBE_CONTAINERD_BIN" ] || [ ! -d "$old" ] || { rm -rf "$old"; say "removed the stale $old"; }
done
echo "$KUBE_CONTAINERD_BIN"
