package waiter

import (
	"os"
	"strings"
	"syscall"
)

// BatchStdinVariable names, in the environment the waiter sends, the file slurmstepd opened as
// the batch script's stdin (sbatch --input); absent for /dev/null, every job's default. The daemon
// gives the first pod that file's path in the pod, which the agent opens as the script's stdin.
const BatchStdinVariable = "SLURM_K8S_BRIDGE_BATCH_STDIN"

// WithBatchStdin is env with BatchStdinVariable set to what fd 0 (the stdin slurmstepd gave the
// batch step) is, unless that is /dev/null; a value the user exported never passes for it.
func WithBatchStdin(env Object) Object {
	kept := make(Object, 0, len(env)+1)
	for _, f := range env {
		if f.Key != BatchStdinVariable {
			kept = append(kept, f)
		}
	}
	var stdin, null syscall.Stat_t
	if syscall.Fstat(0, &stdin) != nil {
		return kept // closed: the script reads nothing, as from /dev/null
	}
	if syscall.Stat("/dev/null", &null) == nil && stdin.Mode&syscall.S_IFMT == syscall.S_IFCHR && stdin.Rdev == null.Rdev {
		return kept
	}
	path, err := os.Readlink("/proc/self/fd/0")
	if err != nil || !strings.HasPrefix(path, "/") {
		return kept // a pipe or a socket ("pipe:[…]"): never what sbatch --input opens
	}
	kept.Set(BatchStdinVariable, path)
	return kept
}
