"""One door to each outside system: Slurm (slurmrestd, pyslurm), Kubernetes, munge."""
