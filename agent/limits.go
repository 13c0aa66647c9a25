package main

// The job's resource limits and umask in the pod, as slurmstepd gives them to the job's
// processes natively: the soft limits of SLURM_RLIMIT_<NAME> (what the waiter or task proxy
// had on the slurmd host, where slurmstepd set them from sbatch's or srun's propagation), and the
// umask of SLURM_UMASK (the submitting shell's, which sbatch and srun put there).

import (
	"os"
	"strconv"
	"syscall"
)

// slurmLimits are the limits Slurm propagates, by its names, then the others the waiter passes on
// (internal/earlysignals/limits.go), by Linux's; their numbers are Linux's (<sys/resource.h>).
var slurmLimits = []struct {
	name     string
	resource int
}{
	{"CPU", 0}, {"FSIZE", 1}, {"DATA", 2}, {"STACK", 3}, {"CORE", 4}, {"RSS", 5}, {"NPROC", 6},
	{"NOFILE", 7}, {"MEMLOCK", 8}, {"AS", 9}, {"LOCKS", 10}, {"SIGPENDING", 11}, {"MSGQUEUE", 12},
	{"NICE", 13}, {"RTPRIO", 14}, {"RTTIME", 15},
}

type jobLimits struct {
	soft  map[int]uint64
	umask int // -1: none given
}

// takeJobLimits reads the job's limits and umask, and takes SLURM_RLIMIT_* out of this process's
// environment (slurmstepd does: the job never sees them); SLURM_UMASK stays, as natively.
func takeJobLimits() jobLimits {
	limits := jobLimits{soft: map[int]uint64{}, umask: -1}
	for _, limit := range slurmLimits {
		name := "SLURM_RLIMIT_" + limit.name
		value, given := os.LookupEnv(name)
		_ = os.Unsetenv(name)
		if !given {
			continue
		}
		if len(value) > 0 && value[0] == 'U' { // srun --propagate's mark: the same to us
			value = value[1:]
		}
		if soft, err := strconv.ParseUint(value, 10, 64); err == nil {
			limits.soft[limit.resource] = soft
		}
	}
	if mask, err := strconv.ParseUint(os.Getenv("SLURM_UMASK"), 8, 32); err == nil && mask <= 0o777 {
		limits.umask = int(mask)
	}
	return limits
}

// around runs start (which starts the job's process) with the job's limits and umask in force,
// so the process starts with them, and then puts the agent's own back. A soft limit above the
// pod's hard one stays as it is (slurmstepd, not root there, could not raise it either).
func (l jobLimits) around(start func() error) error {
	saved := map[int]syscall.Rlimit{}
	for resource, soft := range l.soft {
		var current syscall.Rlimit
		// Set even where it seems unchanged: the Go runtime raised this process's own
		// RLIMIT_NOFILE, and gives a child the one it started with unless it is set here.
		if syscall.Getrlimit(resource, &current) != nil || soft > current.Max {
			continue
		}
		if syscall.Setrlimit(resource, &syscall.Rlimit{Cur: soft, Max: current.Max}) == nil {
			saved[resource] = current
		}
	}
	previous := -1
	if l.umask >= 0 {
		previous = syscall.Umask(l.umask)
	}
	err := start()
	for resource, limit := range saved {
		_ = syscall.Setrlimit(resource, &limit)
	}
	if previous >= 0 {
		syscall.Umask(previous)
	}
	return err
}
