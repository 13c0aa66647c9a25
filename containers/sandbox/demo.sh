#!/usr/bin/env bash
# `make demo`: show the sandbox at work from the host shell.
# Until the bridge daemon lands (issue 3) it submits one job to the native
# partition and runs one pod on a real Kubernetes node, side by side.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
eval "$("$(dirname "$0")/sandbox.sh" env)"

say "sinfo:"; sinfo
say "kubectl get nodes (real + first simulated):"; kubectl get nodes -o wide | head -5

cd "$SBX_SHARED_HOME/alice"
job=$(runuser -u alice -- sbatch --parsable -p native --gres=gpu:1 \
  --wrap 'echo "hello from $(hostname) as $(id -un), GPUs $CUDA_VISIBLE_DEVICES"; exit 3')
say "submitted job $job as alice; waiting for sacct"
for _ in $(seq 100); do
  state=$(sacct -n -X -P -j "$job" -o State | head -1)
  case "$state" in COMPLETED|FAILED|CANCELLED*|TIMEOUT) break ;; esac
  sleep 0.2
done
sacct -X -j "$job" -o JobID,User,Account,Partition,State,ExitCode,NodeList
say "slurm-$job.out:"; cat "slurm-$job.out"

pod="demo-$job"
kubectl run "$pod" --image=sandbox.local/busybox:1 --image-pull-policy=IfNotPresent --restart=Never \
  --overrides='{"spec":{"nodeSelector":{"type":"real"},"tolerations":[{"key":"slurm-k8s-bridge/bridged","operator":"Exists"}]}}' \
  --command -- sh -c 'echo "hello from pod on $(hostname)"; exit 7' >/dev/null
kubectl wait --for=jsonpath='{.status.phase}'=Failed "pod/$pod" --timeout=60s >/dev/null
kubectl get pod "$pod" -o wide
say "pod log:"; kubectl logs "$pod"
kubectl delete pod "$pod" --wait=false >/dev/null
