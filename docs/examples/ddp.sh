#!/bin/sh
#SBATCH -N 2 --ntasks-per-node=2
#K8S image=sandbox.local/debian-python:12
# A DDP-style job: one rank per task, srun starts them across the nodes, each learns its place
# from Slurm's variables, and the ranks meet rank 0 over TCP at the first node's name, as
# torch.distributed's env:// rendezvous does under Slurm. It runs unchanged in a native and in a
# bridged partition.
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
export MASTER_PORT=$((20000 + SLURM_JOB_ID % 10000))
srun python3 -c '
import os, socket, time
rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
local, node = int(os.environ["SLURM_LOCALID"]), int(os.environ["SLURM_NODEID"])
master = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
print(f"rank {rank}/{world} local {local} node {node}", flush=True)
if rank == 0:
    server = socket.create_server(("", master[1]))
    server.settimeout(120)
    total = 0
    for _ in range(world - 1):
        peer, _ = server.accept()
        with peer:
            total += int(peer.makefile().readline())
    print(f"all-reduce: sum of squares of ranks = {total}", flush=True)
else:
    deadline = time.monotonic() + 120
    while True:
        try:
            with socket.create_connection(master, timeout=5) as peer:
                peer.sendall(f"{rank * rank}\n".encode())
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
'
echo "srun exit $?"
