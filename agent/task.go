package main

// One task of a step, run by the daemon in its pod (`agent task`): its environment (srun's
// --export), directory (--chdir), stdin (--input), one stream for a per-task file's stdout and
// stderr, and --multi-prog's line (multiprog.go); then the task itself, which the agent starts and
// waits for (task_wait.go).

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// task is `agent task PIDFILE ENV -- ARGV`: one task of a step, run by the daemon in this pod. ENV is
// base64 JSON of the variables the task gets on top of the container's (srun's environment in
// the script, and the SLURM_* slurmstepd set for this task).
func task(pidfile, encodedEnv string, argv []string) {
	_ = os.MkdirAll(filepath.Dir(pidfile), 0o755)
	raw, err := base64.StdEncoding.DecodeString(encodedEnv)
	if err != nil {
		fail("bad task environment")
	}
	env := map[string]string{}
	if json.Unmarshal(raw, &env) != nil {
		fail("bad task environment")
	}
	// A terminal's task (srun --pty) has its output on the terminal, which a daemon's restart
	// ends anyway; any other task's output goes through the spool (task_spool.go), and the exec's
	// stdin, after the task's --input bytes, carries the daemon's acknowledgements.
	spooled, ackInput := !isTerminal(0), -1
	if spooled {
		if fd, err := syscall.Dup(0); err == nil {
			syscall.CloseOnExec(fd)
			ackInput = fd
		}
	}
	if size := env["SLURM_K8S_BRIDGE_TASK_STDIN_SIZE"]; size != "" {
		taskStdin(pidfile+".in", size) // srun --input: the bytes follow on stdin
	} else if spooled {
		nullStdin() // the acknowledgements are not the task's
	}
	var spool *taskSpool
	var forwarded <-chan bool
	if spooled {
		var err error
		merged := env["SLURM_K8S_BRIDGE_TASK_STDERR_TO_STDOUT"] != ""
		if spool, err = startSpool(pidfile, merged, ackInput); err != nil {
			fail("cannot keep the task's output: " + err.Error())
		}
		forwarded = spool.startForwarding()
		// The agent's own last words (a --multi-prog line it cannot read) end the task as its do.
		atFailure = func(code int) {
			spool.end(code, "")
			spool.close(forwarded, "")
		}
	}
	if env["SLURM_K8S_BRIDGE_TASK_EXACT_ENV"] != "" {
		// srun --export without ALL: the environment is exactly the one given, not the
		// container's. Without a PATH in it a command must be named by its path, as natively.
		os.Clearenv()
	}
	for key, value := range env {
		_ = os.Setenv(key, value)
	}
	// What slurmstepd unsets for this task (the GPU ordinals of a step without GPUs): gone from
	// the container's environment too, not merely empty.
	for _, key := range strings.Split(env["SLURM_K8S_BRIDGE_TASK_UNSET"], ",") {
		if key != "" {
			_ = os.Unsetenv(key)
		}
	}
	if _, given := env["PATH"]; !given && env["SLURM_K8S_BRIDGE_TASK_EXACT_ENV"] == "" {
		// The container's PATH (an interactive step's task): the image's, after the agent's links.
		jobSearchPaths()
	}
	searchPath := os.Getenv("PATH")
	if cwd := env["SLURM_K8S_BRIDGE_TASK_CWD"]; cwd != "" {
		if err := os.Chdir(cwd); err != nil {
			// As slurmstepd does with a --chdir it cannot enter.
			fmt.Fprintf(os.Stderr, "slurmstepd: error: couldn't chdir to `%s': %s: going to /tmp instead\n",
				cwd, errnoText(err))
			_ = os.Chdir("/tmp")
		}
	}
	makeTmpdir(os.Getenv("SLURM_LOCALID") == "0") // after the chdir: a relative one is the task's
	if env["SLURM_K8S_BRIDGE_TASK_MULTI_PROG"] != "" {
		argv = multiProgLine(argv[0], env["SLURM_PROCID"])
	}
	if size := env["SLURM_K8S_BRIDGE_TASK_TTY_SIZE"]; size != "" {
		setWindowSize(0, size)
	}
	unsetSecretKeys()
	for _, key := range []string{"SLURM_K8S_BRIDGE_TASK_CWD",
		"SLURM_K8S_BRIDGE_TASK_EXACT_ENV", "SLURM_K8S_BRIDGE_TASK_MULTI_PROG",
		"SLURM_K8S_BRIDGE_TASK_STDIN_SIZE", "SLURM_K8S_BRIDGE_TASK_STDERR_TO_STDOUT",
		"SLURM_K8S_BRIDGE_TASK_UNSET", "SLURM_K8S_BRIDGE_TASK_TTY_SIZE",
		// The first pod's spec gives them to every exec too: the agent's, never a task's.
		"SLURM_K8S_BRIDGE_USAGE_INTERVAL", "SLURM_K8S_BRIDGE_STOP_GRACE", scriptStdinVariable, jobPathVariable, jobLibraryPathVariable} {
		_ = os.Unsetenv(key)
	}
	path := argv[0]
	if !strings.Contains(path, "/") {
		if found, err := lookPath(path, searchPath); err == nil {
			path = found
		}
	}
	code, usage := runTask(path, argv, pidfile)
	if spool != nil {
		spool.end(code, usage)
		spool.close(forwarded, usage)
	}
	os.Exit(code)
}

func errnoText(err error) string {
	var pathErr *os.PathError
	if errors.As(err, &pathErr) {
		err = pathErr.Err
	}
	text := err.Error()
	if text != "" {
		text = strings.ToUpper(text[:1]) + text[1:]
	}
	return text
}

// taskStdin makes the task's stdin a file of exactly SIZE bytes read from the exec's stdin (the
// daemon sends the --input file's bytes; the exec protocol cannot close stdin, so the length says
// where it ends), as slurmstepd gives a task its --input file.
func taskStdin(path, size string) {
	n, err := strconv.Atoi(size)
	if err != nil || n < 0 {
		fail("bad task input size")
	}
	file, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		fail("cannot keep the task's input: " + err.Error())
	}
	_ = os.Remove(path)
	if _, err := io.CopyN(file, os.Stdin, int64(n)); err != nil {
		fail("short task input: " + err.Error())
	}
	if _, err := file.Seek(0, io.SeekStart); err != nil {
		fail(err.Error())
	}
	if err := syscall.Dup2(int(file.Fd()), 0); err != nil {
		fail(err.Error())
	}
	_ = file.Close()
}

// nullStdin gives the task an empty stdin, as slurmstepd gives a task no input was meant for.
func nullStdin() {
	if null, err := os.Open(os.DevNull); err == nil {
		_ = syscall.Dup2(int(null.Fd()), 0)
		_ = null.Close()
	}
}

func lookPath(name, searchPath string) (string, error) {
	for _, dir := range filepath.SplitList(searchPath) {
		candidate := filepath.Join(dir, name)
		if info, err := os.Stat(candidate); err == nil && !info.IsDir() && info.Mode()&0o111 != 0 {
			return candidate, nil
		}
	}
	return "", os.ErrNotExist
}
