package main

// The daemon stops a run (scancel, a requeue, the time limit) by deleting its pods, and the kubelet
// then sends this agent SIGTERM. A pod that has just started can wait a while for that: the
// kubelet's worker for it finishes its start first, and meanwhile the script goes on after a
// step its slurmstepd has already ended, where natively slurmstepd signals the script and the
// steps at once. So the daemon also sends the agent SIGTERM itself, with `agent signal` on the
// pid file written here; the agent takes it, and the kubelet's after it, as one stop.

import (
	"os"
	"path/filepath"
	"strconv"
)

// runAgentPidfile holds the pid of the agent running the batch script, in its state directory
// (wellknown.AGENT_RUN_PIDFILE).
const runAgentPidfile = "agent.pid"

// stopRequests writes this agent's pid where the daemon's `agent signal` finds it. Without it,
// the kubelet's SIGTERM alone stops the run, as before.
func stopRequests(dir string) {
	_ = os.WriteFile(filepath.Join(dir, runAgentPidfile), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644)
}
