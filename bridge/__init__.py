"""slurm-k8s-bridge: real Slurm schedules, Kubernetes runs."""

__version__ = "0.1.0"
