package main

// The job's resource limits and umask in the pod, as slurmstepd gives them to the job's
// processes natively: the soft limits of SLURM_RLIMIT_<NAME> (what the waiter or task proxy
// had on the slurmd host, where slurmstepd set them from sbatch's or srun's propagation), and the
// umask of SLURM_UMASK (the submitting shell's, which sbatch and srun put there).
//
// slurmstepd sets them in the forked child, as root, just before the exec. The agent is neither
// root nor able to act between Go's fork and exec, and lowering its own limits for a moment would
// let them bite the agent (a fork past RLIMIT_NPROC, a thread or a heap past RLIMIT_AS, fds past
// RLIMIT_NOFILE in its relays). So the script or task is started through a second, short-lived
// agent (`agent with-limits script|task PATH -- ARGV`) that sets them on itself and execs the
// program: its pid, group and terminal become the program's, and so does SLURM_TASK_PID.

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
)

// slurmLimits are the limits Slurm propagates, by its names, then the others the waiter passes on
// (internal/startlimits), by Linux's; their numbers are those of <sys/resource.h> on
// amd64 and arm64. DATA, AS and NPROC come last: once they are set, this process allocates as
// little as it can before its exec.
var slurmLimits = []struct {
	name     string
	resource int
}{
	{"CPU", 0}, {"FSIZE", 1}, {"STACK", 3}, {"CORE", 4}, {"RSS", 5}, {"NOFILE", 7}, {"MEMLOCK", 8},
	{"LOCKS", 10}, {"SIGPENDING", 11}, {"MSGQUEUE", 12}, {"NICE", 13}, {"RTPRIO", 14}, {"RTTIME", 15},
	{"DATA", 2}, {"AS", 9}, {"NPROC", 6},
}

// throughLimits is argv started through `agent with-limits script|task`: always, for that second
// agent also gives the program its SLURM_TASK_PID (below).
func throughLimits(kind, path string, argv []string) (string, []string) {
	self, err := os.Executable()
	if err != nil {
		return path, argv // without them rather than not at all
	}
	return self, append([]string{self, "with-limits", kind, path, "--"}, argv...)
}

// withLimits is `agent with-limits KIND PATH -- ARGV`: take SLURM_RLIMIT_* out of the environment
// (slurmstepd does: the job never sees them), set their soft limits and SLURM_UMASK's umask on
// this process, and become the program. As slurmstepd: a soft limit above the pod's hard one is
// lowered to it, unless srun --propagate asked for it (the `U` mark: then it stays as it is);
// SLURM_UMASK leaves a batch script's environment (keepUmask false) and stays in a task's.
// notFound, notRunnable: the exit codes for an exec that fails (the caller's, as if it had
// started the program itself).
func withLimits(path string, argv []string, keepUmask bool, notFound, notRunnable int, say func(error)) {
	mask, maskErr := strconv.ParseUint(os.Getenv("SLURM_UMASK"), 8, 32)
	if !keepUmask {
		_ = os.Unsetenv("SLURM_UMASK")
	}
	if maskErr == nil && mask <= 0o777 {
		syscall.Umask(int(mask))
	}
	values := make([]string, len(slurmLimits))
	for i, limit := range slurmLimits {
		name := "SLURM_RLIMIT_" + limit.name
		values[i], _ = os.LookupEnv(name)
		_ = os.Unsetenv(name)
	}
	// The exec keeps this process's pid: the program's, which slurmstepd gives the script and
	// each task natively (a step task's came from its proxy on the slurmd host, a pid of no use
	// here).
	_ = os.Setenv("SLURM_TASK_PID", strconv.Itoa(os.Getpid()))
	environ := os.Environ() // before the limits: DATA and AS may leave little to allocate
	settleEarlySignals()    // before the limits too: it starts a timer
	for i, limit := range slurmLimits {
		value := values[i]
		asked := len(value) > 0 && value[0] == 'U'
		if asked {
			value = value[1:]
		}
		soft, err := strconv.ParseUint(value, 10, 64)
		var current syscall.Rlimit
		if err != nil || syscall.Getrlimit(limit.resource, &current) != nil || (asked && soft > current.Max) {
			continue
		}
		// Set even where it seems unchanged: the Go runtime raised this process's own
		// RLIMIT_NOFILE, and the exec would otherwise keep that.
		_ = syscall.Setrlimit(limit.resource, &syscall.Rlimit{Cur: min(soft, current.Max), Max: current.Max})
	}
	err := syscall.Exec(path, argv, environ)
	say(err)
	if errors.Is(err, syscall.ENOENT) {
		os.Exit(notFound)
	}
	os.Exit(notRunnable)
}

// withLimitsMain parses `with-limits script|task PATH -- ARGV` (os.Args[2:]) and names the
// failure as the script's start (run) or a task's (task_wait.go) does.
func withLimitsMain(args []string) {
	if len(args) < 4 || args[2] != "--" || (args[0] != "script" && args[0] != "task") {
		fail("usage: slurm-k8s-bridge-agent with-limits script|task PATH -- ARGV...")
	}
	path, argv := args[1], args[3:]
	input := os.Getenv(scriptStdinVariable)
	_ = os.Unsetenv(scriptStdinVariable) // the first pod gives it to every exec: never a task's
	if args[0] == "script" && input != "" {
		scriptStdinFrom(input)
	}
	if args[0] == "task" {
		withLimits(path, argv, true, 2, 2, func(err error) {
			fmt.Fprintf(os.Stderr, "slurmstepd: error: execve(): %s: %v\n", argv[0], err)
		})
	}
	withLimits(path, argv, false, 127, 126, func(err error) {
		fmt.Fprintf(os.Stderr, "slurm-k8s-bridge-agent: cannot run %s: %v\n", argv[0], err)
	})
}

// scriptStdinVariable names, in the first pod, the file sbatch --input gave the batch script as its
// stdin: slurmstepd opened it on the slurmd host as the user; the daemon gives its path through the
// volume the pod shares with that host.
const scriptStdinVariable = "SLURM_K8S_BRIDGE_SCRIPT_STDIN"

// scriptStdinFrom makes path this process's stdin before it becomes the script: opened here, as the
// job's user in the script's own process, so whatever the name leads to (a link the user swapped
// in, /proc/self/...) is only what the script itself could open. A file it cannot open ends the
// script before it runs, with the reason in its error output.
func scriptStdinFrom(path string) {
	input, err := os.Open(path)
	if err == nil {
		err = syscall.Dup2(int(input.Fd()), 0)
		_ = input.Close()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "slurm-k8s-bridge-agent: cannot open the script's input (sbatch --input) %s: %v\n",
			path, err)
		os.Exit(1)
	}
}
