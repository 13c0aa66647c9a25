package main

// The script's end, told on the log stream ("x" frame), so that the daemon ends the job as soon as
// the line arrives, not a kubelet status cycle later (the kubelet notices an exited container
// when it next relists its runtime: up to a second).
//
// Only the agent may write that frame: it makes itself non-dumpable before the script starts, so
// the job's processes (same user, no capabilities) can neither open /proc/AGENT/fd/1 to write
// frames of their own nor read its memory. The script's own output reaches the log only as
// "o"/"e" frames of what it wrote.

import (
	"encoding/base64"
	"os"
	"strconv"
	"strings"
	"syscall"
)

const prSetDumpable = 4 // PR_SET_DUMPABLE, <linux/prctl.h>

// undumpable reports whether the agent could make itself non-dumpable; if not (a seccomp profile
// refusing prctl), the job runs all the same, without the ending frame (the daemon then waits for
// the kubelet, as it would for an older agent).
func undumpable() bool {
	_, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetDumpable, 0, 0)
	return errno == 0
}

// cgroupEvents is the job container's memory.events (its own cgroup namespace).
const cgroupEvents = "/sys/fs/cgroup/memory.events"

// oomKills counts the kernel's OOM kills in the container's cgroup: the runtime reports the
// container as OOMKilled after any of them, which the daemon explains to the user; "-" when it
// cannot be read (then the daemon waits for the runtime's word on any failure).
func oomKills() string {
	raw, err := os.ReadFile(cgroupEvents)
	if err != nil {
		return "-"
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if value, ok := strings.CutPrefix(line, "oom_kill "); ok {
			if _, err := strconv.ParseUint(value, 10, 64); err == nil {
				return value
			}
		}
	}
	return "-"
}

// endingFrame is the last frame: "x <base64 of 'exited CODE oom N stop S' or 'signaled SIG oom N
// stop S'>". S is 1 when the agent itself was told to stop (the kubelet's SIGTERM: a deletion, an
// eviction, a node shutdown): then the daemon waits for the pod's status, which says why.
func endingFrame(status syscall.WaitStatus, stopped bool) []byte {
	how := "exited " + strconv.Itoa(status.ExitStatus())
	if status.Signaled() {
		how = "signaled " + strconv.Itoa(int(status.Signal()))
	}
	stop := "0"
	if stopped {
		stop = "1"
	}
	text := how + " oom " + oomKills() + " stop " + stop
	line := make([]byte, 0, 3+base64.StdEncoding.EncodedLen(len(text)))
	line = append(line, 'x', ' ')
	line = base64.StdEncoding.AppendEncode(line, []byte(text))
	return append(line, '\n')
}
