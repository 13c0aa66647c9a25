package main

import (
	"os"
	"path/filepath"
	"strings"
)

// defaultPath is the PATH a container gets from its runtime when its image names none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// jobPathVariable names the submitted PATH's entries on volumes the pods share with the slurmd
// host (bridge/core/job_environment.py shared_path_entries): a conda env's bin, ~/bin.
const jobPathVariable = "SLURM_K8S_BRIDGE_JOB_PATH"

// agentFirstOnPath puts the agent's bin directory (the `srun` and Slurm command links beside the
// running copy, see install) first on PATH, then the job's own directories on shared volumes, in
// the user's order around the image's. The pod's spec sets no PATH, so what follows is the image's own (a conda or
// CUDA image finds its programs), never the slurmd host's.
func agentFirstOnPath() {
	jobPath := os.Getenv(jobPathVariable)
	_ = os.Unsetenv(jobPathVariable) // the agent's: never the script's or a task's variable
	self, err := os.Executable()
	if err != nil {
		return
	}
	bin := filepath.Join(filepath.Dir(self), "bin")
	current := os.Getenv("PATH")
	if current == "" {
		current = defaultPath
	}
	if list := filepath.SplitList(current); len(list) > 0 && list[0] == bin {
		return
	}
	_ = os.Setenv("PATH", withJobPath(bin, jobPath, current))
}

// withJobPath is bin, then the job's directories, with the image's PATH where the daemon marked
// its place with an empty entry ("before::after"; at the end without one).
func withJobPath(bin, jobPath, image string) string {
	before, after, _ := strings.Cut(jobPath, "::")
	if strings.HasPrefix(jobPath, ":") { // no shared entry before the host's own directories
		before, after = "", strings.TrimPrefix(jobPath, ":")
	}
	entries := []string{bin}
	for _, part := range []string{before, image, after} {
		if part != "" {
			entries = append(entries, part)
		}
	}
	return strings.Join(entries, string(os.PathListSeparator))
}
