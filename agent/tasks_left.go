package main

// A job's step tasks outlive its batch script, as natively. When a script ends, or is killed
// (scancel, a requeue, the time limit), each step's tasks are ended by their own slurmstepd:
// SIGTERM, then KillWait, then SIGKILL, which reach a task in the pod through its task proxy. The
// agent is the container's first process, and when it exits the kernel kills every other
// process of the container at once: a task's TERM trap, its checkpoint and its last lines were
// lost, and sacct showed the step killed (0:9) where natively it ended as it chose. So the agent
// stays while the daemon's `agent task` processes run, at most tasksLeftLimit (Slurm's default
// KillWait: by then slurmstepd has killed every task proxy); the kubelet's grace period bounds
// that sooner once the pod is being deleted. Only once the daemon knows the script's end from its
// ending frame: without one, the container's end is the job's.

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const (
	tasksLeftPoll  = 50 * time.Millisecond
	tasksLeftLimit = 30 * time.Second
)

// taskAgentsRunning counts this container's `agent task` processes (the daemon's execs of a
// step's tasks, each waiting for its task).
func taskAgentsRunning() int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	self := os.Getpid()
	// Only this agent's own binary: the container's execs of it. Outside a container (the unit
	// tests), /proc shows every agent of the machine, whose tasks are none of this job's.
	own, _ := os.Executable()
	count := 0
	for _, entry := range entries {
		pid, err := strconv.Atoi(entry.Name())
		if err != nil || pid == self {
			continue
		}
		raw, err := os.ReadFile("/proc/" + entry.Name() + "/cmdline")
		if err != nil {
			continue // gone meanwhile
		}
		argv := strings.Split(string(raw), "\x00")
		if len(argv) > 2 && argv[1] == "task" && filepath.Base(argv[0]) == agentBinary {
			if exe, err := os.Readlink("/proc/" + entry.Name() + "/exe"); err == nil && own != "" && exe != own {
				continue
			}
			if end, _, _ := readTaskState(spoolFilesOf(argv[2]).run); end != nil {
				continue // its task has ended: it only waits for the daemon's word on its output
			}
			count++
		}
	}
	return count
}

// agentBinary is the agent's file name, as the daemon runs it (bridge/core/wellknown.py).
const agentBinary = "slurm-k8s-bridge-agent"

// waitForTasksLeft returns once no step task runs in this container, reaping what is left to
// the agent meanwhile (a task whose `agent task` died leaves its processes to the first one).
func waitForTasksLeft() {
	deadline := time.Now().Add(tasksLeftLimit)
	for taskAgentsRunning() > 0 && time.Now().Before(deadline) {
		reapOrphans()
		time.Sleep(tasksLeftPoll)
	}
	reapOrphans()
	if tasksRanHere() { // also true of every task waited for above
		// A task's last lines are still on their way out of its exec (the runtime copies them
		// after the process ended); the container's end would cut them.
		time.Sleep(execDrainTime)
	}
}

// execDrainTime is how long the agent stays after the last task ended, so that its output leaves
// the runtime's exec stream before the container ends.
const execDrainTime = 250 * time.Millisecond

// reapOrphans collects every child that has ended, without waiting for one that has not.
func reapOrphans() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}

// tasksRanHere: a step's task ran in this container (`agent task` keeps its pid file in the
// agent's tasks directory), perhaps ending just before the agent looked.
func tasksRanHere() bool {
	self, err := os.Executable()
	if err != nil {
		return false
	}
	_, err = os.Stat(filepath.Join(filepath.Dir(self), "tasks"))
	return err == nil
}
