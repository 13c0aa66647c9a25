// Command waiter is the job-side waiter of slurm-k8s-bridge: what a bridged job's batch script
// runs on its slurmd host in place of the user's script, a task proxy of its steps, and a
// user-step proxy. See internal/waiter.
package main

import (
	"os"

	"slurm-k8s-bridge/agent/internal/waiter"
)

func main() {
	os.Exit(waiter.Main(os.Args[1:]))
}
