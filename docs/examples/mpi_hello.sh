#!/bin/bash
#SBATCH -N 2 --ntasks-per-node=1
#K8S image=sandbox.local/debian-mpi:12
# MPI hello world across two nodes: Open MPI's mpirun starts its daemons with srun (one per
# node, a real step), they start the ranks, and the ranks talk over TCP (pod to pod when bridged).
export OMPI_MCA_btl=self,vader,tcp
# Waiting ranks yield the CPU instead of spinning (the sandbox's nodes share two cores).
export OMPI_MCA_mpi_yield_when_idle=1
mpirun python3 -c '
import sys
from mpi4py import MPI
world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
total = world.allreduce(rank)
hosts = sorted(set(world.allgather(MPI.Get_processor_name())))
# One write per line: with PYTHONUNBUFFERED exported into the job, print() writes the text and the
# newline apart, and mpirun may put the line of the other rank between the two.
sys.stdout.write(f"rank {rank} of {size}: sum of ranks {total}, {len(hosts)} hosts\n")
sys.stdout.flush()
'
echo "mpirun said $?"
