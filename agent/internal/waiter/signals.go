package waiter

import (
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"syscall"
	"time"
	"unsafe"
)

// Signals that come while the waiter starts, and the signal
// mask of what it starts. The SPANK step guard blocks the forwarded signals when it execs the
// waiter; the Go runtime keeps USR1, USR2 and ALRM blocked until Notify asks for them, so they
// wait, pending.

// EarlyKept are the signals the waiter takes from its first moment: the forwarded ones and the
// TERM that may stop the job.
var EarlyKept = append(append([]syscall.Signal{}, Forwarded...), syscall.SIGTERM)

// HoldEarlySignals keeps every EarlyKept signal, in order, on the returned channel, for the
// handlers that main sets later: first those pending when the process started (taken by
// internal/earlysignals before the Go runtime could act on them), then those that come. Writes
// to a closed pipe then fail with EPIPE, instead of ending the waiter.
func HoldEarlySignals(pendingAtStart []syscall.Signal) chan os.Signal {
	early := make(chan os.Signal, 64)
	for _, sig := range pendingAtStart {
		early <- sig
	}
	for _, sig := range EarlyKept {
		signal.Notify(early, sig)
	}
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	deadly := make(chan os.Signal, 1)
	for _, sig := range DeadlySignals {
		signal.Notify(deadly, sig)
	}
	go func() { dieWithoutCore((<-deadly).(syscall.Signal)) }()
	return early
}

// DeadlySignals end the waiter by themselves, as their default action ends any process (a
// `scancel -s SEGV --batch`, say, as the job's owner may send): the Go runtime would instead print
// its state into the job's stderr and exit 2. Faults of the waiter's own code still panic: Notify
// takes only signals sent from outside.
var DeadlySignals = []syscall.Signal{syscall.SIGILL, syscall.SIGTRAP, syscall.SIGABRT, syscall.SIGBUS,
	syscall.SIGFPE, syscall.SIGSEGV, syscall.SIGSYS, syscall.SIGXCPU}

// dieWithoutCore ends the process by sig, leaving no core of it on the host: whoever sends the
// signal (the job's user) must not get the waiter's memory written anywhere.
func dieWithoutCore(sig syscall.Signal) {
	_ = syscall.Setrlimit(syscall.RLIMIT_CORE, &syscall.Rlimit{})
	_, _, _ = syscall.RawSyscall6(syscall.SYS_PRCTL, 4 /* PR_SET_DUMPABLE */, 0, 0, 0, 0, 0)
	dieBySignal(sig)
	os.Exit(128 + int(sig))
}

// sigset is a kernel signal set (the 64 standard and real-time signals).
type sigset uint64

func setOf(signals ...syscall.Signal) sigset {
	var set sigset
	for _, sig := range signals {
		set |= 1 << (uint(sig) - 1)
	}
	return set
}

func threadSigmask(how int, set sigset) {
	_, _, _ = syscall.RawSyscall6(syscall.SYS_RT_SIGPROCMASK, uintptr(how),
		uintptr(unsafe.Pointer(&set)), 0, 8, 0, 0)
}

// startUnblocked starts cmd with no signal blocked. A child gets the mask of the thread that
// forks it, and Go's threads keep the mask the waiter was started with (the guard's): srun and
// munge must start with none blocked.
func startUnblocked(cmd *exec.Cmd) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	threadSigmask(1 /* SIG_UNBLOCK */, setOf(EarlyKept...))
	return cmd.Start()
}

// runUnblocked is startUnblocked, then Wait.
func runUnblocked(cmd *exec.Cmd) error {
	if err := startUnblocked(cmd); err != nil {
		return err
	}
	return cmd.Wait()
}

// dieBySignal ends the process by sig, its default action, so that Slurm records it (sacct
// shows e.g. 0:9). It returns only if sig did not end the process (a second later).
func dieBySignal(sig syscall.Signal) {
	signal.Reset(sig)
	if sig != syscall.SIGKILL && sig != syscall.SIGSTOP {
		// The Go runtime ignores a signal nobody asked for (USR1...): its default action must be
		// the kernel's again. A zeroed struct sigaction is SIG_DFL with no flags.
		var action [4]uintptr
		_, _, _ = syscall.RawSyscall6(syscall.SYS_RT_SIGACTION, uintptr(sig),
			uintptr(unsafe.Pointer(&action)), 0, 8, 0, 0)
	}
	runtime.LockOSThread()
	threadSigmask(1, setOf(sig))
	_ = syscall.Tgkill(syscall.Getpid(), syscall.Gettid(), sig)
	time.Sleep(time.Second)
	runtime.UnlockOSThread()
}
