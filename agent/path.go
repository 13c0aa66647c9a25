package main

import (
	"os"
	"path/filepath"
)

// defaultPath is the PATH a container gets from its runtime when its image names none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// agentFirstOnPath puts the agent's bin directory (the `srun` and Slurm command links beside the
// running copy, see install) first on PATH. The pod's spec sets no PATH, so what follows is the
// image's own (a conda or CUDA image finds its programs), never the slurmd host's.
func agentFirstOnPath() {
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
	_ = os.Setenv("PATH", bin+string(os.PathListSeparator)+current)
}
