// Package earlysignals takes what the Go runtime must not act on from the waiter's start, before
// the runtime starts: the signals that are pending (this file), and the job's variables that
// would steer the runtime (environment.go).
//
// The SPANK step guard execs the waiter with the signals Slurm sends a batch script blocked
// (deploy/slurm/spank/slurm_k8s_bridge_guard.c, slurm_spank_task_init): one sent meanwhile stays
// pending across the exec, for the waiter to act on once its handlers are set. The Go
// runtime unblocks HUP, INT, TERM and QUIT on its first thread before any Go code runs (they
// are not blockable in a Go executable), so such a signal would end the Go waiter by its
// default action (or, for QUIT, dump its goroutines into the job's error file). A C constructor,
// which the C library runs before it starts the Go runtime, takes every pending one of them
// instead, in the order the kernel would deliver them, for the waiter to act on first.
//
// It takes them only: it changes no signal's mask nor its action, so what comes later is as
// before.
//
// The waiter runs with the job's environment, which the user shapes; the SPANK guard holds every
// variable but SLURM_* out of its way, and where it did not, GODEBUG, GOTRACEBACK, GOGC,
// GOMEMLIMIT, GOMAXPROCS... would steer the waiter's runtime (its TLS, tracebacks into the job's
// error file, core dumps, memory), SSL_CERT_FILE and SSL_CERT_DIR the roots its TLS trusts.
// A second constructor takes every GO* variable and those two out of the environment the runtime
// reads; Environ gives them back, for the job's tasks.
//
// The waiter must be linked with cgo for the constructors to be there; cmd/waiter refuses to
// build without it.
package earlysignals

/*
#include <signal.h>
#include <time.h>

#define EARLY_MAX 8

static int early_taken[EARLY_MAX];
static int early_count;

// HUP, INT, QUIT, USR1, USR2, ALRM, TERM: the forwarded ones and the TERM that may stop the job.
static const int early_kept[] = {SIGHUP, SIGINT, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGTERM};

__attribute__((constructor)) static void take_pending_signals(void)
{
	sigset_t pending, wanted;
	struct timespec now = {0, 0};

	if (sigpending(&pending) != 0)
		return;
	sigemptyset(&wanted);
	for (unsigned i = 0; i < sizeof(early_kept) / sizeof(early_kept[0]); i++)
		if (sigismember(&pending, early_kept[i]) == 1)
			sigaddset(&wanted, early_kept[i]);
	// A pending signal is a blocked one: sigtimedwait takes it without running any action, the
	// lowest number first, as the kernel delivers them when they are unblocked.
	while (early_count < EARLY_MAX) {
		int signum = sigtimedwait(&wanted, NULL, &now);
		if (signum <= 0)
			break;
		early_taken[early_count++] = signum;
		sigdelset(&wanted, signum);
	}
}

static int early_signal(int i) { return i < early_count ? early_taken[i] : 0; }
*/
import "C"

import "syscall"

// Kept are the signals taken: those the waiter forwards to the script, then TERM.
var Kept = []syscall.Signal{syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2,
	syscall.SIGALRM, syscall.SIGTERM}

// Taken are the signals that were pending when the process started, in delivery order.
func Taken() []syscall.Signal {
	var taken []syscall.Signal
	for i := 0; C.early_signal(C.int(i)) != 0; i++ {
		taken = append(taken, syscall.Signal(C.early_signal(C.int(i))))
	}
	return taken
}
