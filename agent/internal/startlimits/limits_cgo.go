//go:build cgo

// Package startlimits has a process's soft resource limits and umask as they were when it
// started, before the Go runtime raised its own soft RLIMIT_NOFILE to the hard one (it does so
// before any Go code runs, and keeps the value it found to itself). The waiter passes on what
// slurmstepd set for it; the pod's srun passes on what its caller, the batch script, set.
//
// A C constructor reads them in the waiter, linked with cgo. The agent is built without (it runs
// in every job's container, under its seccomp profile): limits_nocgo.go reads them late and leaves
// out an RLIMIT_NOFILE the runtime raised, which the pod's srun asks a shell for.
package startlimits

/*
#include <sys/resource.h>
#include <sys/stat.h>

// Slurm's propagated limits (its slurm_rlimits_info list), then the others a native job inherits
// from slurmd, in the order of limitNames below.
static const int limit_resources[] = {RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_DATA, RLIMIT_STACK, RLIMIT_CORE,
	RLIMIT_RSS, RLIMIT_NPROC, RLIMIT_NOFILE, RLIMIT_MEMLOCK, RLIMIT_AS, RLIMIT_LOCKS, RLIMIT_SIGPENDING,
	RLIMIT_MSGQUEUE, RLIMIT_NICE, RLIMIT_RTPRIO, RLIMIT_RTTIME};
#define LIMIT_COUNT (sizeof(limit_resources) / sizeof(limit_resources[0]))
static unsigned long long start_soft[LIMIT_COUNT];
static int start_known[LIMIT_COUNT];
static unsigned start_umask;

// Before the Go runtime starts, which raises its own soft RLIMIT_NOFILE to the hard one: the
// limits as the process was started with them.
__attribute__((constructor)) static void keep_start_limits(void)
{
	struct rlimit limit;

	for (unsigned i = 0; i < LIMIT_COUNT; i++)
		if (getrlimit(limit_resources[i], &limit) == 0) {
			start_soft[i] = limit.rlim_cur;
			start_known[i] = 1;
		}
	start_umask = umask(0);
	umask(start_umask);
}

static int limit_known(int i) { return start_known[i]; }
static unsigned long long limit_soft(int i) { return start_soft[i]; }
static unsigned umask_at_start(void) { return start_umask; }
*/
import "C"

// exactNofile: StartLimits always has RLIMIT_NOFILE's first value.
const exactNofile = true

// StartLimits are SLURM_RLIMIT_<NAME>=<soft limit> entries for each limit, and SLURM_UMASK=<umask>,
// as the process had them at its start. For the waiter, slurmstepd set them from sbatch's or srun's
// SLURM_RLIMIT_* and SLURM_UMASK, and took those out of a batch script's environment; the job's
// processes in the pods get the same (the agent sets them, then takes these variables out again
// as slurmstepd does).
func StartLimits() []string {
	entries := make([]string, 0, len(limitNames)+1)
	for i, name := range limitNames {
		if C.limit_known(C.int(i)) != 0 {
			entries = append(entries, limitEntry(name, uint64(C.limit_soft(C.int(i)))))
		}
	}
	return append(entries, umaskEntry(uint(C.umask_at_start())))
}
