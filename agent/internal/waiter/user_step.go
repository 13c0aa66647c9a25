package waiter

import (
	"os"
	"strconv"
	"strings"
)

// The user-step proxy (`waiter step -- ARGV...`): what a task of a
// step the user started in a bridged job becomes. It has the daemon run ARGV in the job's pod on
// this node, as the user, in the step's directory and with the step's environment. The user's
// program never runs here: only its argv travels, as data.

// RunUserStep runs this task's argv in the pod of this node; the task's exit code.
func RunUserStep(apiURL, caFile string, argv []string, environment Object, workDir string, early chan os.Signal) int {
	// What slurmstepd set for this task after the guard held the environment (SLURMD_NODENAME,
	// SLURM_PROCID, ...) is here as it is.
	environment = append(Object{}, environment...)
	for _, f := range slurmVariables(Environ()) {
		environment.Set(f.Key, f.Value)
	}
	jobID, problem := jobIDOf(environment)
	if problem != "" {
		return crash(problem)
	}
	node, step := lookup(environment, "SLURMD_NODENAME"), lookup(environment, "SLURM_STEP_ID")
	procid := "0"
	if v, ok := environment.Get("SLURM_PROCID"); ok {
		procid = v.(string)
	}
	var env Object
	for _, f := range environment {
		if !strings.HasPrefix(f.Key, "SLURM_K8S_BRIDGE") {
			env = append(env, f)
		}
	}
	tty := isatty(0) && isatty(1)
	body := Object{{"step", step}, {"node", node}, {"argv", argv}, {"cwd", workDir}, {"env", env}, {"tty", tty}}
	prefix := "/v1/jobs/" + strconv.FormatInt(jobID, 10)
	route := signalRoute{prefix + "/user-task-signal", Object{{"step", step}, {"procid", procid}, {"node", node}}}
	if tty {
		// srun --pty: slurmstepd gave this task a terminal; the task in the pod gets one too.
		client, _, err := startSignalPassing(apiURL, caFile, jobID, route, early)
		if err != nil {
			return crash("ValueError: " + err.Error())
		}
		return runTerminalTask(client, prefix+"/user-task-tty", body)
	}
	return proxyTask(apiURL, caFile, jobID, prefix+"/user-task", body, route, early)
}
