package startlimits

import (
	"fmt"
	"strconv"
)

// limitNames are Slurm's names of the limits it propagates (SLURM_RLIMIT_<NAME>, its
// slurm_rlimits_info list), then Linux's names of the rest: a native job has those of slurmd,
// which the pods' runtime need not share (`ulimit -a` shows them all). limitResources are their
// numbers in <sys/resource.h> (amd64 and arm64), in the same order; the C constructor's list in
// limits_cgo.go is the same one by the C library's names.
var (
	limitNames = []string{"CPU", "FSIZE", "DATA", "STACK", "CORE", "RSS", "NPROC", "NOFILE", "MEMLOCK", "AS",
		"LOCKS", "SIGPENDING", "MSGQUEUE", "NICE", "RTPRIO", "RTTIME"}
	limitResources = []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}
)

// SlurmPropagates is how many of the first limitNames Slurm propagates (srun's --propagate and
// PropagateResourceLimits name them); the rest only the bridge passes on.
const SlurmPropagates = 10

// SlurmNames are the names of the limits Slurm propagates (its slurm_rlimits_info list).
func SlurmNames() []string { return limitNames[:SlurmPropagates:SlurmPropagates] }

// Propagated reports whether name (SLURM_RLIMIT_<name>) is one Slurm propagates.
func Propagated(name string) bool {
	for _, known := range SlurmNames() {
		if name == known {
			return true
		}
	}
	return false
}

// limitEntry and umaskEntry are StartLimits' entries, as srun writes the variables.
func limitEntry(name string, soft uint64) string {
	return "SLURM_RLIMIT_" + name + "=" + strconv.FormatUint(soft, 10)
}

func umaskEntry(mask uint) string { return fmt.Sprintf("SLURM_UMASK=%04o", mask) }
