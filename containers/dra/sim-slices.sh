#!/usr/bin/env bash
# Publish mock GPUs for the kwok nodes as ResourceSlices of driver gpu.example.com, shaped as the
# example driver publishes them on the real nodes (gpu-0..gpu-N, attributes index and uuid): no
# driver runs there (kwok runs no containers), but the bridge's `simdra` partition maps Slurm's
# GRES indices to them and writes its claims, which is what make bench-scale counts. Idempotent
# (kubectl apply). Called by containers/kube/up.sh.
# Usage: containers/dra/sim-slices.sh
set -euo pipefail
. "$(dirname "$0")/../kube/common.sh"

manifest() {
  local node i
  for node in $(sim_node_names); do
    printf -- '---\napiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata:\n  name: %s-gpu.example.com-sim\n' "$node"
    printf 'spec:\n  driver: gpu.example.com\n  nodeName: %s\n  pool: {name: %s, generation: 1, resourceSliceCount: 1}\n  devices:\n' "$node" "$node"
    for ((i = 0; i < SBX_GPUS_PER_NODE; i++)); do
      printf '  - name: gpu-%d\n    attributes:\n      index: {int: %d}\n      uuid: {string: sim-%s-gpu-%d}\n' \
        "$i" "$i" "$node" "$i"
    done
  done
}
manifest | kc apply -f - >/dev/null
