#!/usr/bin/env bash
# Build etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy
# (helper module k8s/) and kwok (module kwok/) into $SBX_CACHE/bin/<key>/.
# Skips what is already there. Prints the bin dir on stdout.
# Usage: containers/kube/build.sh [--force]
set -euo pipefail
. "$(dirname "$0")/common.sh"

force=0
[ "${1:-}" = --force ] && force=1

missing=()
for b in $KUBE_BINARIES; do
  if [ "$force" = 1 ] || [ ! -x "$KUBE_BIN/$b" ]; then missing+=("$b"); fi
done
if [ ${#missing[@]} = 0 ]; then
  echo "$KUBE_BIN"
  exit 0
fi

export PATH="/usr/local/go/bin:$PATH"
command -v go >/dev/null || die "go not found (needs Go >= 1.24; the machine image ships it in /usr/local/go)"
grep -q "k8s.io/kubernetes $SBX_K8S_VERSION\$" "$KUBE_SRC/k8s/go.mod" ||
  die "k8s/go.mod does not require k8s.io/kubernetes $SBX_K8S_VERSION (settings.sh)"
grep -q "sigs.k8s.io/kwok $SBX_KWOK_VERSION\$" "$KUBE_SRC/kwok/go.mod" ||
  die "kwok/go.mod does not require sigs.k8s.io/kwok $SBX_KWOK_VERSION (settings.sh)"

# Static binaries; -buildvcs=false because the helper modules sit in this git
# repo and stamping would make the go build cache key depend on the checkout.
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false
tmp="$KUBE_BIN.tmp.$$"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT

k8s_pkgs=()
for b in "${missing[@]}"; do
  case $b in
    etcd) k8s_pkgs+=(./etcd) ;;
    kwok) ;;
    *) k8s_pkgs+=("k8s.io/kubernetes/cmd/$b") ;;
  esac
done

start=$SECONDS
if [ ${#k8s_pkgs[@]} -gt 0 ]; then
  say "go build ${k8s_pkgs[*]} (cold: ~20-30 min on 2 cores; warm go cache: ~1 min)"
  (cd "$KUBE_SRC/k8s" && go build -trimpath -ldflags "$KUBE_LDFLAGS" -o "$tmp/" "${k8s_pkgs[@]}")
fi
if [[ " ${missing[*]} " == *" kwok "* ]]; then
  say "go build kwok"
  (cd "$KUBE_SRC/kwok" && go build -trimpath -ldflags "$KWOK_LDFLAGS" -o "$tmp/" sigs.k8s.io/kwok/cmd/kwok)
fi
mkdir -p "$KUBE_BIN"
for b in "${missing[@]}"; do mv -f "$tmp/$b" "$KUBE_BIN/$b"; done
say "built ${missing[*]} in $((SECONDS - start))s into $KUBE_BIN"
# Binaries of earlier pins or flags (~0.5 GB each) are never used again by this checkout.
for old in "$SBX_CACHE"/bin/k8s-*; do
  [ "$old" = "$KUBE_BIN" ] || [ ! -d "$old" ] || { rm -rf "$old"; say "removed the stale $old"; }
done
echo "$KUBE_BIN"
