//go:build !cgo

package startlimits

import "syscall"

// exactNofile: StartLimits always has RLIMIT_NOFILE's first value.
const exactNofile = false

// StartLimits without cgo (the agent's build; the waiter is linked with it): the limits as they
// are now. The Go runtime raised a soft RLIMIT_NOFILE below the hard one to one below it before any Go
// code ran, so one there is left out: the first value is not known.
func StartLimits() []string {
	entries := make([]string, 0, len(limitNames)+1)
	for i, name := range limitNames {
		var limit syscall.Rlimit
		if syscall.Getrlimit(limitResources[i], &limit) != nil {
			continue
		}
		if name == "NOFILE" && limit.Max > 0 && limit.Cur == limit.Max-1 {
			continue
		}
		entries = append(entries, limitEntry(name, limit.Cur))
	}
	mask := syscall.Umask(0)
	syscall.Umask(mask)
	return append(entries, umaskEntry(uint(mask)))
}
