package waiter

import (
	"os"
	"syscall"
)

// The job's own output files: what slurmstepd opened for -o and -e on
// fds 1 and 2, and the waiter's few words of its own there.

// WriteAll writes every byte of data to fd 1 or 2 (any other fd is not the job's: ignored).
func WriteAll(fd int, data []byte) error {
	if fd != 1 && fd != 2 {
		return nil
	}
	for len(data) > 0 {
		n, err := syscall.Write(fd, data)
		if err == syscall.EINTR || err == syscall.EAGAIN {
			continue
		}
		if err != nil {
			return &os.PathError{Op: "write", Err: err}
		}
		data = data[n:]
	}
	return nil
}

// OutputMerged tells whether stdout and stderr are one file: the pods then keep the order
// between the two streams.
func OutputMerged() bool {
	var out, errs syscall.Stat_t
	if syscall.Fstat(1, &out) != nil || syscall.Fstat(2, &errs) != nil {
		return true
	}
	return out.Dev == errs.Dev && out.Ino == errs.Ino
}

// Say writes one line of the bridge's own to the job's stderr, marked as the bridge's.
func Say(text string) {
	_ = WriteAll(2, []byte("slurm-k8s-bridge: "+text+"\n"))
}
