package main

// The agent stays the parent of a step's task, as slurmstepd is natively: it starts the task as
// the leader of its own process group (so a step's signals, sent to that group, reach every
// process of the task, and the task leaving it changes nothing, as before), waits for it, ends as
// it ended, and reports what it used (its wait4 rusage, what slurmstepd's accounting takes
// natively) in a line on stderr that the daemon takes off the stream and hands to the task's
// proxy (bridge/core/agent_protocol.py UsageTrailer).

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

// usageTrailer starts the task's usage line on its stderr (NULs: no text output starts so).
const usageTrailer = "\x00\x00slurm-k8s-bridge-usage "

// runTask starts the task with the agent's fds, environment and directory, names it in pidfile,
// waits for it and returns the exit code the agent must end with: the task's, or 128+N for a
// task signal N ended (what the pod's exec reports for such a process), and the usage line's
// figures ("" when there is none to report: a terminal's task, one that never started).
func runTask(path string, argv []string, pidfile string) (int, string) {
	// With a terminal (srun --pty), the task's group is the terminal's foreground one: ^C, job
	// control and the shell's reads are the task's, as when it was the exec's process itself.
	terminal := isTerminal(0)
	program, args := throughLimits("task", path, argv)
	env, files, waitStarted := os.Environ(), []uintptr{0, 1, 2}, func() {}
	if program != path { // through with-limits; the pidfile waits for its signals (early_signals.go)
		var started *os.File
		if started, waitStarted, env = startedPipe(env, len(files)); started != nil {
			files = append(files, started.Fd())
		}
	}
	pid, err := syscall.ForkExec(program, args, &syscall.ProcAttr{
		Env: env, Files: files,
		Sys: &syscall.SysProcAttr{Setpgid: true, Foreground: terminal, Ctty: 0},
	})
	waitStarted()
	if err != nil {
		// As slurmstepd reports a task it cannot start; srun then reports exit code 2.
		fmt.Fprintf(os.Stderr, "slurmstepd: error: execve(): %s: %v\n", argv[0], err)
		return 2, ""
	}
	// The task's pid is its group's: `agent signal PIDFILE N group` reaches the task and every
	// process of it (scancel -s, --signal=SIG@T for steps, the kill of a task whose proxy died),
	// and waits for this file, so a signal sent before the task exists reaches it once it does.
	// Renamed into place, so a reader never sees half of it.
	_ = os.WriteFile(pidfile+".tmp", []byte(strconv.Itoa(pid)+"\n"), 0o644)
	_ = os.Rename(pidfile+".tmp", pidfile)
	var status syscall.WaitStatus
	var rusage syscall.Rusage
	for {
		if _, err := syscall.Wait4(pid, &status, 0, &rusage); err != syscall.EINTR {
			break
		}
	}
	usage := ""
	if !terminal {
		usage = usageFigures(&rusage)
	}
	if status.Signaled() {
		return 128 + int(status.Signal()), usage
	}
	return status.ExitStatus(), usage
}

// usageFigures are the usage line's figures: user µs, system µs, RSS, max RSS, vsize, max vsize,
// read, written, major faults. The task has ended: its resident set is its largest process's
// largest (ru_maxrss); what rusage does not have is unknown.
func usageFigures(rusage *syscall.Rusage) string {
	maxRss := rusage.Maxrss * 1024
	return fmt.Sprintf("%d %d %d %d - - - - %d\n",
		rusage.Utime.Sec*1_000_000+rusage.Utime.Usec, rusage.Stime.Sec*1_000_000+rusage.Stime.Usec,
		maxRss, maxRss, rusage.Majflt)
}

// setWindowSize gives the terminal on fd the size "ROWS COLS" (srun --pty's, from the user's
// terminal) before the task starts, as slurmstepd sizes the pty before the task exists. The
// exec's own resize message is not enough: it may come after the task read its size (0x0, seen).
func setWindowSize(fd int, size string) {
	rowsText, colsText, found := strings.Cut(size, " ")
	rows, rowsErr := strconv.ParseUint(rowsText, 10, 16)
	cols, colsErr := strconv.ParseUint(colsText, 10, 16)
	if !found || rowsErr != nil || colsErr != nil || rows == 0 || cols == 0 {
		return
	}
	window := [4]uint16{uint16(rows), uint16(cols), 0, 0}
	_, _, _ = syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.TIOCSWINSZ,
		uintptr(unsafe.Pointer(&window)))
}

// windowSize is srun's TIOCGWINSZ on fd: nil on a terminal.
func windowSize(fd int) error {
	var window [4]uint16
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.TIOCGWINSZ,
		uintptr(unsafe.Pointer(&window))); errno != 0 {
		return errno
	}
	return nil
}

func isTerminal(fd int) bool {
	var termios syscall.Termios
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.TCGETS,
		uintptr(unsafe.Pointer(&termios)))
	return errno == 0
}
