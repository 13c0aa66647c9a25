// Package fdtest helps tests that need a file of their own on a standard descriptor.
package fdtest

import (
	"os"
	"syscall"
	"testing"
)

// OnStdin runs f with fd 0 replaced by file, restoring the original after.
func OnStdin(t testing.TB, file *os.File, f func()) {
	t.Helper()
	saved, err := syscall.Dup(0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Dup2(saved, 0); _ = syscall.Close(saved) }()
	if err := syscall.Dup2(int(file.Fd()), 0); err != nil {
		t.Fatal(err)
	}
	f()
}
