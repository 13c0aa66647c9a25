package main

// The agent stays the parent of a step's task, as slurmstepd does natively: it waits for it, ends
// as it ended, and reports what it used (its wait4 rusage, which slurmstepd's accounting takes
// natively) as a trailer on stderr that the daemon takes off the stream and hands to the task's
// proxy (bridge/core/agent_protocol.py UsageTrailer, bridge/waiter/usage.py).

import (
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"unsafe"
)

// usageTrailer starts the task's usage line on its stderr (NULs: no text output starts so).
const usageTrailer = "\x00\x00slurm-k8s-bridge-usage "

// taskSignals holds the signals that reach the agent before its task exists, for the task.
type taskSignals struct {
	mu      sync.Mutex
	pending []syscall.Signal
	child   int
}

// catchTaskSignals starts catching every signal, before the pid file names this process group:
// one sent to the group once the task exists reaches the task itself (the agent only must not die
// of it first); one that comes before is passed on once the task exists, as it would have got it.
// Caught, not ignored: an ignored signal would stay ignored in the task.
func catchTaskSignals() *taskSignals {
	held := &taskSignals{}
	caught := make(chan os.Signal, 16)
	signal.Notify(caught)
	go func() {
		for sig := range caught {
			number, ok := sig.(syscall.Signal)
			held.mu.Lock()
			if ok && held.child == 0 && number != syscall.SIGCHLD && number != syscall.SIGURG {
				held.pending = append(held.pending, number)
			}
			held.mu.Unlock()
		}
	}()
	return held
}

func (held *taskSignals) started(pid int) {
	held.mu.Lock()
	defer held.mu.Unlock()
	held.child = pid
	for _, sig := range held.pending {
		_ = syscall.Kill(pid, sig)
	}
}

// runTask starts the task (its process group is this one, its fds and environment ours), waits
// for it and returns the exit code the agent must end with.
func runTask(path string, argv []string, held *taskSignals) int {
	pid, err := syscall.ForkExec(path, argv, &syscall.ProcAttr{
		Env: os.Environ(), Files: []uintptr{0, 1, 2},
	})
	if err == nil {
		held.started(pid)
	}
	if err != nil {
		// As slurmstepd reports a task it cannot start; srun then reports exit code 2.
		fmt.Fprintf(os.Stderr, "slurmstepd: error: execve(): %s: %v\n", argv[0], err)
		return 2
	}
	var status syscall.WaitStatus
	var rusage syscall.Rusage
	for {
		if _, err := syscall.Wait4(pid, &status, 0, &rusage); err != syscall.EINTR {
			break
		}
	}
	reportTaskUsage(&rusage)
	if status.Signaled() {
		dieBy(status.Signal())
	}
	return status.ExitStatus()
}

// reportTaskUsage writes the usage trailer on stderr, unless stderr is a terminal (srun --pty:
// the trailer would be on the user's screen).
func reportTaskUsage(rusage *syscall.Rusage) {
	if isTerminal(2) {
		return
	}
	maxRss := rusage.Maxrss * 1024
	// user µs, system µs, RSS, max RSS, vsize, max vsize, read, written, major faults: the task
	// has ended, so its resident set is its largest; what rusage does not have is unknown.
	line := fmt.Sprintf("%s%d %d %d %d - - - - %d\n", usageTrailer,
		rusage.Utime.Sec*1_000_000+rusage.Utime.Usec, rusage.Stime.Sec*1_000_000+rusage.Stime.Usec,
		maxRss, maxRss, rusage.Majflt)
	_, _ = os.Stderr.WriteString(line)
}

// dieBy ends the agent as the task ended by `sig`: 128+N, the code the pod's exec reports for a
// process a signal ended (the task proxy takes it for that signal, bridge/waiter/task.py).
func dieBy(sig syscall.Signal) {
	os.Exit(128 + int(sig))
}

func isTerminal(fd int) bool {
	var termios syscall.Termios
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.TCGETS,
		uintptr(unsafe.Pointer(&termios)))
	return errno == 0
}
