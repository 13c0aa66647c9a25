package main

// Suspend and resume (scontrol suspend/resume, gang time-slicing, suspend preemption).
// slurmstepd stops every process of a native job's steps with SIGSTOP and continues them with
// SIGCONT; `signal-all` does the same in the pod: it signals every process the job's user may
// signal in the pod's PID namespace (shared by its containers), which are the job's processes
// (the script, its tasks, the agent holding a node), never the pause process (another user)
// nor itself (kill(-1) skips the caller).

import (
	"errors"
	"strconv"
	"syscall"
)

func signalAll(sig string) {
	number, err := strconv.Atoi(sig)
	if err != nil || (syscall.Signal(number) != syscall.SIGSTOP && syscall.Signal(number) != syscall.SIGCONT) {
		fail("signal-all takes SIGSTOP or SIGCONT (by number), not " + strconv.Quote(sig))
	}
	if err := syscall.Kill(-1, syscall.Signal(number)); err != nil && !errors.Is(err, syscall.ESRCH) {
		fail("cannot signal the job's processes: " + err.Error())
	}
}
