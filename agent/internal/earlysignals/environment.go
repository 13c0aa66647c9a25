package earlysignals

/*
#include <stddef.h>
#include <string.h>

extern char **environ;

// More GO* variables than this in one job would be absurd; any beyond it still go (the runtime
// must not read them) but do not reach the job's tasks.
#define ASIDE_MAX 256

static char *aside[ASIDE_MAX];
static int aside_at[ASIDE_MAX];
static int aside_count;

// steers_go: a variable the Go runtime or its TLS reads (GODEBUG, GOTRACEBACK, GOGC, GOMEMLIMIT,
// GOMAXPROCS, GORACE...; SSL_CERT_FILE, SSL_CERT_DIR). Every GO* name goes, future ones too.
static int steers_go(const char *entry)
{
	size_t name = strcspn(entry, "=");
	return strncmp(entry, "GO", 2) == 0 || (name == 13 && strncmp(entry, "SSL_CERT_FILE", 13) == 0) ||
	       (name == 12 && strncmp(entry, "SSL_CERT_DIR", 12) == 0);
}

// The C library runs this before the Go runtime starts; environ is still the array on the stack
// that the runtime reads its environment from, so what is taken out of it here the runtime never
// sees. The strings stay where they are, on the stack: only the array is compacted (as glibc's
// unsetenv does), each one taken noted with its index for Environ.
__attribute__((constructor)) static void set_aside_go_settings(void)
{
	char **kept = environ;

	if (environ == NULL)
		return;
	for (int i = 0; environ[i] != NULL; i++) {
		char *entry = environ[i];
		if (!steers_go(entry)) {
			*kept++ = entry;
		} else if (aside_count < ASIDE_MAX) {
			aside[aside_count] = entry;
			aside_at[aside_count++] = i;
		}
	}
	*kept = NULL;
}

static int aside_index(int i) { return aside_at[i]; }
static const char *aside_entry(int i) { return aside[i]; }
static int aside_total(void) { return aside_count; }
*/
import "C"

import (
	"slices"
	"syscall"
)

// Environ is the environment the process was started with, in its order: the process's own
// (syscall.Environ) with the variables the constructor set aside put back where they were. The
// job's tasks get what the job exported, as they do natively (a GOPATH, a GOMAXPROCS...).
func Environ() []string {
	env := syscall.Environ()
	// Ascending original indexes: what comes before each one is already as it was.
	for i := 0; i < int(C.aside_total()); i++ {
		at := min(int(C.aside_index(C.int(i))), len(env))
		env = slices.Insert(env, at, C.GoString(C.aside_entry(C.int(i))))
	}
	return env
}
