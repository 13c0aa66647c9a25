# Shared by the Helm build and its callers: where the sandbox's helm binary lives. Sourced, never run.
# shellcheck source=../sandbox/lib.sh
HELM_SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HELM_SRC/../sandbox/lib.sh"

# The pinned version is go.mod's requirement (one place; build.sh checks the module has it).
HELM_VERSION=$(sed -n 's/^require helm.sh\/helm\/v4 \(v[0-9.]*\)$/\1/p' "$HELM_SRC/go.mod")
# -X gives `helm version` the real version (else "v4.3").
HELM_LDFLAGS="-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION \
-X helm.sh/helm/v4/internal/version.gitTreeState=clean"

# Cache key: the helper module and the flags; a change of either builds anew into a new directory.
helm_bin_key() {
  local h
  h=$( (cd "$HELM_SRC" && cat go.mod go.sum tools.go && echo "$HELM_LDFLAGS|cgo0|trimpath") |
    sha256sum | cut -c1-12)
  echo "helm-$HELM_VERSION-$h"
}
HELM_BIN="$SBX_CACHE/bin/$(helm_bin_key)"
HELM="$HELM_BIN/helm"

# hc ARGS...: helm against the sandbox's API server (ADMIN_KUBECONFIG from kube/common.sh), its
# own config, cache and data under the sandbox's state (gone with sandbox-down).
hc() {
  HELM_CONFIG_HOME="$SBX_STATE/helm/config" HELM_CACHE_HOME="$SBX_STATE/helm/cache" \
    HELM_DATA_HOME="$SBX_STATE/helm/data" "$HELM" --kubeconfig "${ADMIN_KUBECONFIG:?}" "$@"
}
