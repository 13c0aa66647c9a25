package main

// The job's TMPDIR in its pod, as slurmstepd makes it for a task on its host (task.c,
// _make_tmpdir): the pod's filesystem is not the host's, so a TMPDIR slurmstepd checked there
// (a site's per-job directory, say) is checked again here.

import (
	"os"
	"syscall"
)

// makeTmpdir sets TMPDIR for the process about to start, if it is its node's first task
// (slurmstepd does it for local task 0 only; the others keep what they were given): /tmp when
// unset; a given one is made (0700) when missing and replaced by /tmp when it is not a directory
// the job can write and enter. Silent, as natively (slurmstepd logs it in its own log, which the
// user does not see).
func makeTmpdir(firstTask bool) {
	if !firstTask {
		return
	}
	dir, set := os.LookupEnv("TMPDIR")
	if !set {
		_ = os.Setenv("TMPDIR", "/tmp")
		return
	}
	if os.Mkdir(dir, 0o700) == nil || usableDir(dir) {
		return
	}
	_ = os.Setenv("TMPDIR", "/tmp")
}

// usableDir: dir is a directory this process may write in and enter.
func usableDir(dir string) bool {
	info, err := os.Stat(dir)
	if err != nil || !info.IsDir() {
		return false
	}
	return syscall.Access(dir, 0o3) == nil // W_OK|X_OK
}
