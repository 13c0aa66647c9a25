#!/usr/bin/env bash
# `make demo`: the sandbox with the bridge running, one sbatch flowing through:
# the job's pod on the node Slurm chose, its output in slurm-<id>.out, its line in sacct.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
eval "$("$(dirname "$0")/sandbox.sh" env)"
"$SBX_REPO/containers/bridge/up.sh"

say "sinfo:"; sinfo
cd "$SBX_SHARED_HOME/alice"
cat >demo-job.sh <<'JOB'
#!/bin/sh
#SBATCH --job-name=demo --gres=gpu:2
#K8S image=sandbox.local/debian-python:12
echo "hello from $(hostname) as uid $(id -u) gid $(id -g), GPUs $NVIDIA_VISIBLE_DEVICES"
python3 -c 'import platform; print("python", platform.python_version(), "in the container")'
sleep 3
exit 3
JOB
chown alice: demo-job.sh
job=$(runuser -u alice -- sbatch --parsable -p k8s demo-job.sh)
say "alice submitted job $job (sbatch -p k8s demo-job.sh); its pod:"
for _ in $(seq 50); do
  kubectl get pods -n slurm-jobs -l "slurm-k8s-bridge/job-id=$job" 2>/dev/null | grep -q . && break
  sleep 0.1
done
kubectl get pods -n slurm-jobs -l "slurm-k8s-bridge/job-id=$job" -o wide
for _ in $(seq 300); do
  state=$(sacct -n -X -P -j "$job" -o State | head -1)
  case "$state" in COMPLETED|FAILED|CANCELLED*|TIMEOUT|OUT_OF_MEMORY) break ;; esac
  sleep 0.2
done
say "sacct:"; sacct -X -j "$job" -o JobID,User,Account,Partition,State,ExitCode,NodeList
say "slurm-$job.out:"; cat "slurm-$job.out"
say "done. Try it yourself: eval \"\$(make -s sandbox-env)\"; cd /home/alice; runuser -u alice -- sbatch -p k8s demo-job.sh"
