package main

// A signal sent to the script or a task while it is still this agent (`with-limits`, between the
// fork and the exec of the program) must do what it does to the program natively there: end it by
// its default action. The Go runtime instead catches and drops SIGUSR1, SIGUSR2, SIGALRM and the
// like, and turns SIGQUIT or SIGABRT into a goroutine dump and exit 2. A task given `scancel -s
// USR1` the moment it started then ran on as if no signal was sent (seen in CI, under load).

import (
	"os"
	"os/signal"
	"syscall"
	"time"
	"unsafe"
)

// earlySignals are those whose default action ends the process but which the runtime does not
// let end it. SIGHUP, SIGINT and SIGTERM are left alone: the runtime dies of them itself, and
// keeps them ignored where the agent was started with them ignored, as the exec then does.
var earlySignals = []os.Signal{
	syscall.SIGQUIT, syscall.SIGABRT, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGALRM,
	syscall.SIGPIPE, syscall.SIGVTALRM, syscall.SIGXCPU, syscall.SIGXFSZ, syscall.SIGIO,
	syscall.SIGPWR,
}

// settleMark is a real-time signal (SIGRTMIN+6) this process sends itself before its exec. The
// runtime hands caught signals on in the order of their numbers, so once the mark, numbered above
// every early signal, has come through, any early signal caught before it has been acted on.
const settleMark = syscall.Signal(40)

// settled is closed once the mark has come through; nil unless this process is `with-limits`.
var settled chan struct{}

func init() {
	// As early as Go lets code run: only the runtime's own start comes before it.
	if len(os.Args) > 1 && os.Args[1] == "with-limits" {
		dieOfEarlySignals()
	}
}

// dieOfEarlySignals makes the first of earlySignals end this process by that signal. The exec
// resets the handler, so the program itself gets every signal its own way.
func dieOfEarlySignals() {
	caught := make(chan os.Signal, len(earlySignals)+1)
	signal.Notify(caught, append([]os.Signal{settleMark}, earlySignals...)...)
	settled = make(chan struct{})
	go func() {
		for got := range caught {
			sig, ok := got.(syscall.Signal)
			if !ok {
				continue
			}
			if sig == settleMark {
				close(settled)
				return
			}
			dieOf(sig)
		}
	}()
}

// settleEarlySignals comes just before the exec: from here on the kernel itself ends this process
// for an early signal (the default action), and one the runtime caught before has ended it.
func settleEarlySignals() {
	if settled == nil {
		return
	}
	for _, sig := range earlySignals {
		if number, ok := sig.(syscall.Signal); ok {
			setDefaultAction(number)
		}
	}
	_ = syscall.Kill(os.Getpid(), settleMark)
	select {
	case <-settled:
	case <-time.After(2 * time.Second): // never seen; the exec goes on rather than hang the job
	}
}

// setDefaultAction sets sig's action to SIG_DFL past the runtime's handler, which would catch it.
func setDefaultAction(sig syscall.Signal) {
	// The kernel's struct sigaction, all zero: SIG_DFL, no flags, an empty mask (its layout on
	// amd64 and arm64 fits in these 32 bytes).
	var action [4]uint64
	_, _, _ = syscall.RawSyscall6(syscall.SYS_RT_SIGACTION, uintptr(sig),
		uintptr(unsafe.Pointer(&action)), 0, 8, 0, 0)
}

// dieOf ends this process by sig, as the kernel's default action does.
func dieOf(sig syscall.Signal) {
	// Not the agent's core in the job's directory: the program never ran.
	_ = syscall.Setrlimit(syscall.RLIMIT_CORE, &syscall.Rlimit{Cur: 0, Max: 0})
	setDefaultAction(sig)
	_ = syscall.Kill(os.Getpid(), sig)
	time.Sleep(time.Second)
	os.Exit(128 + int(sig)) // as a shell reports a death by sig, should the kernel not deliver it
}
