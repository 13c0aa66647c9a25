package main

// A signal sent to the script or a task while it is still this agent (`with-limits`, between the
// fork and the exec of the program) must do what it does to the program natively there: end it by
// its default action. The Go runtime instead catches and drops SIGUSR1, SIGUSR2, SIGALRM and the
// like, and turns SIGQUIT or SIGABRT into a goroutine dump and exit 2. A task given `scancel -s
// USR1` the moment it started then ran on as if no signal was sent (seen in CI, under load).
//
// Signals reach the script or a task by the pid in its pidfile. Its parent writes that file only
// once this process has closed its end of the "started" pipe, right after the Notify below: a
// signal sent by pid never lands in the runtime's own start, where nothing of ours could act.

import (
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// earlySignals are those whose default action ends the process but which the runtime does not
// let end it. SIGHUP, SIGINT and SIGTERM are left alone: the runtime dies of them itself (and
// keeps HUP and INT ignored where the agent was started with them ignored, as the exec then does).
// The synchronous ones are here only as another process sends them (kill -SEGV).
var earlySignals = []os.Signal{
	syscall.SIGQUIT, syscall.SIGABRT, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGALRM,
	syscall.SIGPIPE, syscall.SIGVTALRM, syscall.SIGXCPU, syscall.SIGXFSZ, syscall.SIGIO,
	syscall.SIGPWR, syscall.SIGSEGV, syscall.SIGBUS, syscall.SIGFPE, syscall.SIGILL,
	syscall.SIGTRAP, syscall.SIGSYS, syscall.SIGSTKFLT,
}

// settleMark is a real-time signal (SIGRTMIN+6) this process sends itself before its exec. The
// runtime hands caught signals on in the order of their numbers, so once the mark, numbered above
// every early signal, has come through, any early signal caught before it has been acted on.
const settleMark = syscall.Signal(40)

// startedFdVariable names, for `with-limits` only, the fd of its end of the "started" pipe.
const startedFdVariable = "SLURM_K8S_BRIDGE_STARTED_FD"

var (
	settled chan struct{} // closed once the mark has come through; nil unless `with-limits`
	marking atomic.Bool   // the mark is ours from here on (one another process sends is not)
)

func init() {
	// As early as Go lets code run: only the runtime's own start comes before it.
	if len(os.Args) > 1 && os.Args[1] == "with-limits" {
		dieOfEarlySignals()
		tellStarted()
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
			if sig == settleMark && marking.Load() {
				close(settled)
				return
			}
			dieOf(sig)
		}
	}()
}

// tellStarted closes this process's end of the "started" pipe: its parent may now let signals
// come (startedPipe).
func tellStarted() {
	text, found := os.LookupEnv(startedFdVariable)
	_ = os.Unsetenv(startedFdVariable)
	if fd, err := strconv.Atoi(text); found && err == nil && fd > 2 {
		_ = syscall.Close(fd)
	}
}

// startedPipe is the pipe a parent gives `with-limits` (as fd `fd`, named in env) before it lets
// anyone signal the child: waitStarted returns once the child has made its signals its own (or
// has ended or exec'd). Nil, with env unchanged, if no pipe can be had.
func startedPipe(env []string, fd int) (child *os.File, waitStarted func(), childEnv []string) {
	reader, writer, err := os.Pipe()
	if err != nil {
		return nil, func() {}, env
	}
	waitStarted = func() {
		_ = writer.Close() // the child holds its own copy
		var buf [1]byte
		for {
			if _, err := reader.Read(buf[:]); err != nil {
				break // EOF: the child closed its end, exec'd or ended
			}
		}
		_ = reader.Close()
	}
	return writer, waitStarted, append(env, startedFdVariable+"="+strconv.Itoa(fd))
}

// settleEarlySignals comes just before the exec: from here on the kernel itself ends this process
// for an early signal (the default action), and one the runtime caught before has ended it.
func settleEarlySignals() {
	if settled == nil {
		return
	}
	// No core of the agent if one ends it now (the exec makes the program dumpable again).
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetDumpable, 0, 0)
	for _, sig := range earlySignals {
		if number, ok := sig.(syscall.Signal); ok {
			setDefaultAction(number)
		}
	}
	marking.Store(true)
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

// dieOf ends this process by sig, as the kernel's default action does, without a core of the
// agent (the program never ran).
func dieOf(sig syscall.Signal) {
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetDumpable, 0, 0)
	setDefaultAction(sig)
	_ = syscall.Kill(os.Getpid(), sig)
	time.Sleep(time.Second)
	os.Exit(128 + int(sig)) // as a shell reports a death by sig, should the kernel not deliver it
}
