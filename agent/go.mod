module slurm-k8s-bridge/agent

go 1.24
