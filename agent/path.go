package main

import (
	"os"
	"path/filepath"
	"strings"
)

// defaultPath is the PATH a container gets from its runtime when its image names none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// The submitted PATH's and LD_LIBRARY_PATH's entries on volumes the pods share with the slurmd
// host (bridge/core/job_environment.py shared_path_entries): a conda env's bin, ~/bin, the lib
// directory of a module tree the pods mount.
const (
	jobPathVariable        = "SLURM_K8S_BRIDGE_JOB_PATH"
	jobLibraryPathVariable = "SLURM_K8S_BRIDGE_JOB_LIBRARY_PATH"
)

// jobSearchPaths puts the agent's bin directory (the `srun` and Slurm command links beside the
// running copy, see install) first on PATH, and the job's own directories on shared volumes
// around the image's PATH and LD_LIBRARY_PATH, in the user's order. The pod's spec sets neither,
// so what they hold besides is the image's own (a conda or CUDA image finds its programs and
// libraries), never the slurmd host's.
func jobSearchPaths() {
	jobPath, jobLibraryPath := os.Getenv(jobPathVariable), os.Getenv(jobLibraryPathVariable)
	// The agent's: never the script's or a task's variables.
	_ = os.Unsetenv(jobPathVariable)
	_ = os.Unsetenv(jobLibraryPathVariable)
	if jobLibraryPath != "" {
		_ = os.Setenv("LD_LIBRARY_PATH", aroundTheImages(jobLibraryPath, os.Getenv("LD_LIBRARY_PATH")))
	}
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
	_ = os.Setenv("PATH", bin+string(os.PathListSeparator)+aroundTheImages(jobPath, current))
}

// aroundTheImages is the job's directories with the image's list where the daemon marked its
// place with an empty entry ("before::after"; at the end without one). No entry is empty: in
// LD_LIBRARY_PATH or PATH, one would name the current directory.
func aroundTheImages(jobList, image string) string {
	before, after, _ := strings.Cut(jobList, "::")
	if strings.HasPrefix(jobList, ":") { // no shared entry before the host's own directories
		before, after = "", strings.TrimPrefix(jobList, ":")
	}
	var entries []string
	for _, part := range []string{before, image, after} {
		if part != "" {
			entries = append(entries, part)
		}
	}
	return strings.Join(entries, string(os.PathListSeparator))
}
