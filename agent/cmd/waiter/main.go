// Command waiter is the job-side waiter of slurm-k8s-bridge: what a bridged job's batch script
// runs on its slurmd host in place of the user's script, a task proxy of its steps, and a
// user-step proxy. See internal/waiter.
//
// Build it static, with cgo (for internal/earlysignals and internal/startlimits) and Go's own resolver and user lookup
// (nothing of the C library's NSS, which the host's or the job's settings would steer):
//
//	CGO_ENABLED=1 go build -trimpath -tags netgo,osusergo \
//	    -ldflags '-s -w -linkmode external -extldflags -static' ./cmd/waiter
package main

import (
	"os"

	"slurm-k8s-bridge/agent/internal/earlysignals"
	"slurm-k8s-bridge/agent/internal/startlimits"
	"slurm-k8s-bridge/agent/internal/waiter"
)

func main() {
	os.Exit(waiter.Main(os.Args[1:], earlysignals.Taken(), earlysignals.Environ(), startlimits.StartLimits()))
}
