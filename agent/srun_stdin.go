package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"unicode/utf8"

	"slurm-k8s-bridge/agent/internal/srunargs"
)

// maxSrunStdin bounds what the script's srun reads of its stdin for its step: the request must fit
// one log line the daemon reads whole (base64 twice over, as sbatch's script from stdin; the
// daemon's MAX_STEP_STDIN_BYTES).
const maxSrunStdin = 512 << 10

// srunStdin is what native srun would forward of its stdin to the step's tasks (`echo x | srun
// cat`, the rest of the script's sbatch --input file), read to its end here: Slurm's srun on the
// slurmd host gets it as its stdin and forwards it as it does natively (to every task, or the one
// --input names). Nothing for a character device (/dev/null, the batch default, a terminal), and
// nothing read when srun's --input is a file or none: native srun leaves its stdin alone then
// (MPICH's mpiexec starts `srun --input none` and forwards its own stdin, which it shares).
// A whole file too big for a request (`srun prog < big`, an sbatch --input file the script has not
// read), with no --input given, is named instead as srun's --input: Slurm's srun opens it on the
// slurmd host through the volume the pod shares (the daemon maps the path, or refuses one on no
// volume), and this srun's stdin is left at its end, as native srun leaves it. More than
// maxSrunStdin of anything else ends srun with the reason, as nothing may be lost.
func srunStdin(args []string) ([]byte, []string) {
	input, given := srunargs.Input(args)
	if given && !strings.EqualFold(input, "all") && !isDigits(input) {
		return nil, nil
	}
	var stdin syscall.Stat_t
	if syscall.Fstat(0, &stdin) != nil || stdin.Mode&syscall.S_IFMT == syscall.S_IFCHR {
		return nil, nil
	}
	if stdin.Mode&syscall.S_IFMT == syscall.S_IFREG && !given {
		offset, err := syscall.Seek(0, 0, io.SeekCurrent)
		path, linkErr := os.Readlink("/proc/self/fd/0")
		// Slurm reads % in a file name as a pattern and drops a backslash; a deleted file has no
		// name to open; JSON would change bytes that are not UTF-8.
		named := linkErr == nil && strings.HasPrefix(path, "/") && !strings.ContainsAny(path, "%\\") &&
			!strings.HasSuffix(path, " (deleted)") && utf8.ValidString(path)
		if err == nil && offset == 0 && stdin.Size > maxSrunStdin && named {
			_, _ = syscall.Seek(0, 0, io.SeekEnd)
			return nil, []string{"--input=" + path}
		}
	}
	var data []byte
	var err error
	if stdin.Mode&syscall.S_IFMT == syscall.S_IFIFO && isAnonymousPipe(stdin.Ino) {
		data, err = readPipeUnlessOnlyAncestorsHoldIt(stdin.Ino, maxSrunStdin+1)
	} else {
		data, err = io.ReadAll(io.LimitReader(os.Stdin, maxSrunStdin+1))
	}
	if err != nil {
		return nil, nil
	}
	if len(data) > maxSrunStdin {
		fmt.Fprintf(os.Stderr, "srun: error: a job that runs in Kubernetes passes at most %d KiB of srun's "+
			"stdin to its step; give larger input as a file: srun --input=FILE\n", maxSrunStdin>>10)
		os.Exit(1)
	}
	return data, nil
}

func isDigits(text string) bool {
	for _, r := range text {
		if r < '0' || r > '9' {
			return false
		}
	}
	return text != ""
}
