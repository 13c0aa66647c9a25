#!/usr/bin/env bash
# Build helm (helm.sh/helm/v4, pinned by the helper module here) from the Go module proxy into
# $SBX_CACHE/bin/<key>/helm, as containers/kube/build.sh builds Kubernetes. A no-op when it is
# there (the cache survives sandbox-down). Called by the sandbox's start-up
# (containers/kube/up.sh) and by make bridge-deploy. Prints the binary's path on stdout.
# Usage: containers/helm/build.sh [--force]
set -euo pipefail
. "$(dirname "$0")/common.sh"

if [ "${1:-}" != --force ] && [ -x "$HELM" ]; then
  echo "$HELM"
  exit 0
fi

export PATH="/usr/local/go/bin:$PATH"
command -v go >/dev/null || die "go not found (helm $HELM_VERSION needs Go >= 1.26; the machine image ships it in /usr/local/go)"
[ -n "$HELM_VERSION" ] || die "cannot read helm's version from $HELM_SRC/go.mod"

# Static; -buildvcs=false: the helper module sits in this git repo, and stamping would make the
# go build cache key depend on the checkout.
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false
tmp="$HELM_BIN.tmp.$$"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
say "go build helm $HELM_VERSION (cold: 5-7 min on 2 cores, downloads included; then cached in $HELM_BIN)"
(cd "$HELM_SRC" && go build -trimpath -ldflags "$HELM_LDFLAGS" -o "$tmp/helm" helm.sh/helm/v4/cmd/helm)
mkdir -p "$HELM_BIN"
mv -f "$tmp/helm" "$HELM"
say "built helm $HELM_VERSION in $((SECONDS - start))s into $HELM_BIN"
# Binaries of earlier pins or flags are never used again by this checkout.
for old in "$SBX_CACHE"/bin/helm-*; do
  [ "$old" = "$HELM_BIN" ] || [ ! -d "$old" ] || [[ "$old" == *.tmp.* ]] || { rm -rf "$old"; say "removed the stale $old"; }
done
echo "$HELM"
