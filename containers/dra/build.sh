#!/usr/bin/env bash
# Build the DRA kubelet plugin the sandbox's real nodes run (kubernetes-sigs' dra-example-driver,
# pinned by the helper module here: mock GPUs gpu-0.. with attributes index and uuid, handed to
# containers through CDI) from the Go module proxy into
# $SBX_CACHE/bin/<key>/dra-example-kubeletplugin, as containers/helm/build.sh builds helm. A no-op
# when it is there (the cache survives sandbox-down). Called by containers/kube/up.sh. Prints the
# binary's path on stdout.
# Usage: containers/dra/build.sh [--force]
set -euo pipefail
. "$(dirname "$0")/common.sh"

if [ "${1:-}" != --force ] && [ -x "$DRA_PLUGIN" ]; then
  echo "$DRA_PLUGIN"
  exit 0
fi

export PATH="/usr/local/go/bin:$PATH"
command -v go >/dev/null || die "go not found (the machine image ships it in /usr/local/go)"
[ -n "$DRA_VERSION" ] || die "cannot read dra-example-driver's version from $DRA_SRC/go.mod"

# Static; -buildvcs=false: the helper module sits in this git repo, and stamping would make the
# go build cache key depend on the checkout.
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false
tmp="$DRA_BIN.tmp.$$"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
say "go build dra-example-kubeletplugin $DRA_VERSION (cold: a few minutes, downloads included; then cached in $DRA_BIN)"
(cd "$DRA_SRC" && go build -trimpath -ldflags "$DRA_LDFLAGS" -o "$tmp/dra-example-kubeletplugin" \
  sigs.k8s.io/dra-example-driver/cmd/dra-example-kubeletplugin)
mkdir -p "$DRA_BIN"
mv -f "$tmp/dra-example-kubeletplugin" "$DRA_PLUGIN"
say "built dra-example-kubeletplugin $DRA_VERSION in $((SECONDS - start))s into $DRA_BIN"
# Binaries of earlier pins or flags are never used again by this checkout.
for old in "$SBX_CACHE"/bin/dra-example-driver-*; do
  [ "$old" = "$DRA_BIN" ] || [ ! -d "$old" ] || [[ "$old" == *.tmp.* ]] || { rm -rf "$old"; say "removed the stale $old"; }
done
echo "$DRA_PLUGIN"
