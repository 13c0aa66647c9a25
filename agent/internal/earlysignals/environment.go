package earlysignals

/*
#include <stdlib.h>
#include <string.h>

extern char **environ;

static char emptied[] = "";
static char **original;
static int original_count;

// steers_go: a variable the Go runtime or its TLS reads (GODEBUG, GOTRACEBACK, GOGC, GOMEMLIMIT,
// GOMAXPROCS, GORACE...; SSL_CERT_FILE, SSL_CERT_DIR). Every GO* name goes, future ones too.
static int steers_go(const char *entry)
{
	size_t name = strcspn(entry, "=");
	return strncmp(entry, "GO", 2) == 0 || (name == 13 && strncmp(entry, "SSL_CERT_FILE", 13) == 0) ||
	       (name == 12 && strncmp(entry, "SSL_CERT_DIR", 12) == 0);
}

// The C library runs this before the Go runtime starts; environ is still the array on the stack
// that the runtime reads its environment from, so what is emptied here the runtime never sees.
// Each such slot is pointed at an empty string, which the runtime skips: the array keeps its
// length, because the runtime finds the auxiliary vector right after the array's NULL (a
// compacted array left stale pointers there, and with 3 entries taken the runtime found no page
// size and died). The array as it was is copied first, for Environ.
__attribute__((constructor)) static void set_aside_go_settings(void)
{
	int count = 0;

	if (environ == NULL)
		return;
	while (environ[count] != NULL)
		count++;
	original = malloc((count + 1) * sizeof(char *));
	if (original != NULL) {
		memcpy(original, environ, (count + 1) * sizeof(char *));
		original_count = count;
	}
	for (int i = 0; i < count; i++)
		if (steers_go(environ[i]))
			environ[i] = emptied;
}

static int original_saved(void) { return original != NULL; }
static int original_total(void) { return original_count; }
static const char *original_entry(int i) { return original[i]; }
*/
import "C"

import (
	"strings"
	"syscall"
)

// Environ is the environment the process was started with, as the Go runtime would have read
// it (syscall.Environ: no empty entries, the first of a name kept), the variables the constructor
// emptied included. The job's tasks get what the job exported, as they do natively (a GOPATH, a
// GOMAXPROCS...). The waiter changes none of its own environment, so nothing is lost by reading
// the start's.
func Environ() []string {
	if C.original_saved() == 0 {
		return syscall.Environ() // no memory for the copy at the start: the emptied ones are lost
	}
	env := make([]string, 0, int(C.original_total()))
	seen := map[string]bool{}
	for i := 0; i < int(C.original_total()); i++ {
		entry := C.GoString(C.original_entry(C.int(i)))
		if entry == "" {
			continue
		}
		if name, _, found := strings.Cut(entry, "="); found {
			if seen[name] {
				continue
			}
			seen[name] = true
		}
		env = append(env, entry)
	}
	return env
}
