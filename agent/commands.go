package main

// Slurm's own commands inside the pod: `scontrol`, `squeue`, `sbatch`, `scancel`, `sacct`, `sstat` and
// `sinfo` are this binary too (symlinks beside `srun`). Like srun they run nothing here: they
// ask the agent that runs the batch script, which frames the request into its log as
// "c <base64 JSON>"; the daemon checks it (bridge/core/slurm_commands.py) and the job's waiter,
// the job's user on the slurmd host, runs Slurm's real binary with it. Its output and exit code
// come back as a step's do (`agent step-output`, `agent step-done`).

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// slurmCommands are the names this binary answers to as one of Slurm's commands.
var slurmCommands = map[string]bool{"scontrol": true, "squeue": true, "sbatch": true, "scancel": true,
	"sacct": true, "sinfo": true, "sstat": true}

// maxScriptBytes bounds what sbatch reads here (a script, stdin): the daemon refuses more
// (bridge/core/slurm_commands.py MAX_SCRIPT_BYTES).
const maxScriptBytes = 512 << 10

// maxFrameData bounds a request's framed (base64) size: one log line the daemon reads whole
// (= MAX_REQUEST_BYTES there). A bigger one is refused here, never sent in pieces.
const maxFrameData = 1<<20 - 4096

// commandClient is `NAME ARGS...` for one of slurmCommands: it exits with the code of Slurm's
// binary, having written its output to its own stdout and stderr.
func commandClient(name string, args []string) {
	dir := filepath.Dir(mustExecutable())
	cwd, _ := os.Getwd()
	request := stepRequest{Command: name, Argv: args, Cwd: cwd}
	if name == "sbatch" {
		// sbatch's script is read here, in the pod: which argument is the script is decided by
		// the daemon, which parses the options as sbatch does, so every argument that names a
		// readable file here comes along (bounded).
		request.Env = environ()
		request.Files = map[string][]byte{}
		total, wrap := 0, false
		for _, arg := range args {
			if strings.HasPrefix(arg, "--wrap") {
				wrap = true
			}
			if strings.HasPrefix(arg, "-") || request.Files[arg] != nil {
				continue
			}
			if data, ok := readSmallFile(arg); ok && total+len(data) <= maxScriptBytes+1 {
				request.Files[arg] = data
				total += len(data)
			}
		}
		if !wrap && len(request.Files) == 0 {
			// No script file: sbatch reads the script from stdin, as natively.
			data, _ := io.ReadAll(io.LimitReader(os.Stdin, maxScriptBytes+1))
			request.Stdin = data
		}
	}
	if data, _ := json.Marshal(request); base64.StdEncoding.EncodedLen(len(data)) > maxFrameData {
		fmt.Fprintf(os.Stderr, "%s: error: the arguments, script and environment exceed %d KiB\n", name,
			maxFrameData*3/4>>10)
		os.Exit(1)
	}
	key := ask(dir, name, request)
	awaitResult(dir, key)
}

func readSmallFile(path string) ([]byte, bool) {
	info, err := os.Stat(path)
	if err != nil || !info.Mode().IsRegular() || info.Size() > maxScriptBytes {
		return nil, false
	}
	data, err := os.ReadFile(path)
	return data, err == nil
}
