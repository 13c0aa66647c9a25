#!/bin/sh
#SBATCH -N 2 --ntasks-per-node=2
#K8S image=sandbox.local/debian-python:12
# A DDP-style job: one rank per task, srun starts them across the nodes, each learns its place
# from Slurm's variables (as torchrun or torch.distributed do under Slurm), and the ranks meet
# through the shared submit directory (a stand-in for NCCL's rendezvous). It runs unchanged in a
# native and in a bridged partition.
export RENDEZVOUS="rendezvous-$SLURM_JOB_ID"
mkdir -p "$RENDEZVOUS"
srun python3 -c '
import os, time
rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
local, node = int(os.environ["SLURM_LOCALID"]), int(os.environ["SLURM_NODEID"])
where = os.environ["RENDEZVOUS"]
# Written whole, then renamed: rank 0 must never read a file another rank has only created.
with open(f"{where}/.rank-{rank}", "w") as out:
    out.write(str(rank * rank))
os.rename(f"{where}/.rank-{rank}", f"{where}/rank-{rank}")
print(f"rank {rank}/{world} local {local} node {node}", flush=True)
if rank == 0:
    ready = lambda: [name for name in os.listdir(where) if name.startswith("rank-")]
    while len(ready()) < world:
        time.sleep(0.1)
    total = sum(int(open(f"{where}/{name}").read()) for name in ready())
    print(f"all-reduce: sum of squares of ranks = {total}", flush=True)
'
echo "srun exit $?"
rm -rf "$RENDEZVOUS"
