#!/usr/bin/env bash
# Build the bridge's in-pod agent (agent/: Go, standard library only) as a static binary, in a
# one-file image sandbox.local/slurm-k8s-bridge-agent:1, cached by the hash of its sources; import
# it into the given containerd sockets where their copy differs; and install it on the real nodes
# (they share this host) in $SBX_STATE/agent-node, as the Helm chart's DaemonSet does on a site's
# nodes: the sandbox's job pods mount it from there ([pods] agent_host_dir), with no init
# container. The machine image ships Go in /usr/local/go.
# Usage: containers/images/agent.sh [CONTAINERD_SOCKET...]
set -euo pipefail
IMAGES_SRC="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=../sandbox/lib.sh
. "$IMAGES_SRC/../sandbox/lib.sh"

REF=sandbox.local/slurm-k8s-bridge-agent:1
hash=$(cat "$IMAGES_SRC/agent.sh" "$IMAGES_SRC/mkimage.py" "$SBX_REPO"/agent/go.mod "$SBX_REPO"/agent/*.go \
  "$SBX_REPO"/agent/internal/startlimits/*.go "$SBX_REPO"/agent/internal/srunargs/*.go | sha256sum | cut -c1-12)
dir="$SBX_CACHE/images/agent-$hash"
if ! [ -s "$dir/agent.digest" ]; then
  # Without cgo: the agent is the first process of every job's container, in any image and under
  # the pod's seccomp profile (a static glibc's threads need clone3, which older profiles refuse).
  export PATH="/usr/local/go/bin:$PATH" CGO_ENABLED=0 GOFLAGS=-buildvcs=false
  command -v go >/dev/null || die "go not found (the machine image ships it in /usr/local/go)"
  mkdir -p "$dir"
  tmp=$(mktemp -d "$dir/build.XXXX")
  (cd "$SBX_REPO/agent" && go build -trimpath -ldflags "-s -w" -o "$tmp/root/slurm-k8s-bridge-agent" .)
  python3 "$IMAGES_SRC/mkimage.py" --rootfs "$tmp/root" --name "$REF" \
    --entrypoint '["/slurm-k8s-bridge-agent"]' --out "$dir/agent.tar" >"$dir/agent.digest.new"
  cp "$tmp/root/slurm-k8s-bridge-agent" "$dir/slurm-k8s-bridge-agent"
  mv "$dir/agent.digest.new" "$dir/agent.digest"
  rm -rf "$tmp"
  say "built the in-pod agent image $REF"
fi
want=$(cat "$dir/agent.digest")
for sock in "$@"; do
  if ! ctr -n k8s.io --address "$sock" images ls 2>/dev/null | awk 'NR>1 {print $1, $3}' | grep -qx "$REF $want"; then
    ctr -n k8s.io --address "$sock" images import "$dir/agent.tar" >/dev/null || die "import of $REF into $sock failed"
  fi
done
"$dir/slurm-k8s-bridge-agent" install-on-node "$SBX_STATE/agent-node" 2>&1 | grep -v ' is version ' >&2 || true
[ -x "$SBX_STATE/agent-node/current/slurm-k8s-bridge-agent" ] || die "the agent is not installed in $SBX_STATE/agent-node"
