# Shared by the DRA driver's build and its callers: where the sandbox's kubelet plugin lives.
# Sourced, never run.
# shellcheck source=../sandbox/lib.sh
DRA_SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$DRA_SRC/../sandbox/lib.sh"

# The pinned version is go.mod's requirement (one place; build.sh checks the module has it).
DRA_VERSION=$(sed -n 's/^require sigs.k8s.io\/dra-example-driver \(v[0-9.]*\)$/\1/p' "$DRA_SRC/go.mod")
DRA_LDFLAGS="-s -w"

# Cache key: the helper module and the flags; a change of either builds anew into a new directory.
dra_bin_key() {
  local h
  h=$( (cd "$DRA_SRC" && cat go.mod go.sum tools.go && echo "$DRA_LDFLAGS|cgo0|trimpath") |
    sha256sum | cut -c1-12)
  echo "dra-example-driver-$DRA_VERSION-$h"
}
DRA_BIN="$SBX_CACHE/bin/$(dra_bin_key)"
DRA_PLUGIN="$DRA_BIN/dra-example-kubeletplugin"
