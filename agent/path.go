package main

import (
	"os"
	"path/filepath"
)

// defaultPath is the PATH a container gets from its runtime when its image names none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// jobPathVariable names the submitted PATH's entries on volumes the pods share with the slurmd
// host (bridge/core/job_environment.py shared_path_entries): a conda env's bin, ~/bin.
const jobPathVariable = "SLURM_K8S_BRIDGE_JOB_PATH"

// agentFirstOnPath puts the agent's bin directory (the `srun` and Slurm command links beside the
// running copy, see install) first on PATH, then the job's own directories on shared volumes, in
// the user's order. The pod's spec sets no PATH, so what follows is the image's own (a conda or
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
	first := bin
	if jobPath != "" {
		first += string(os.PathListSeparator) + jobPath
	}
	_ = os.Setenv("PATH", first+string(os.PathListSeparator)+current)
}
