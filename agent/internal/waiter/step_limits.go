package waiter

import (
	"fmt"
	"strconv"
	"strings"

	"slurm-k8s-bridge/agent/internal/startlimits"
)

// A step's limits and umask. Native srun in a batch script propagates its own soft limits
// (SLURM_RLIMIT_<NAME>, by PropagateResourceLimits or its --propagate) and umask (SLURM_UMASK),
// so a script's `ulimit -s unlimited; srun ./app` gives the tasks that stack. Here the script's
// srun is the pod's; it sends what it had (agent/steps.go), and Slurm's srun of the step, which
// has the waiter's limits, is told to propagate none of its own and passes these on instead:
// slurmstepd then sets them for the task proxies, which pass them to the tasks in the pods.

// stepLimits are the variables and srun options that give a step's tasks the limits and umask of
// the script's srun in the pod (requestEnv: its environment, as it sent it), for the step's
// options (the user's --propagate chooses which, as it does natively). A limit the pod's srun
// did not send is the waiter's own (the job's start). Nothing when it sent none (an older agent).
func stepLimits(requestEnv Object, options []string) (env, extraOptions []string) {
	sent := map[string]string{}
	for _, f := range requestEnv {
		name, isLimit := strings.CutPrefix(f.Key, "SLURM_RLIMIT_")
		if value, ok := f.Value.(string); ok && isLimit && startlimits.Propagated(name) && isCount(value) {
			sent[name] = value
		}
	}
	if mask := umaskOf(lookup(requestEnv, "SLURM_UMASK")); mask != "" {
		env = append(env, "SLURM_UMASK="+mask)
	}
	if len(sent) == 0 {
		return env, nil
	}
	chosen, asked, valid := propagateOption(options)
	if !valid {
		return env, nil // Slurm's srun refuses the option itself, in its words
	}
	mark := ""
	if asked {
		mark = "U" // the user asked: slurmstepd sets it even where PropagateResourceLimits does not
	}
	for _, entry := range startLimits {
		name, value, _ := strings.Cut(strings.TrimPrefix(entry, "SLURM_RLIMIT_"), "=")
		if !chosen[name] {
			continue
		}
		if given, ok := sent[name]; ok {
			value = given
		}
		env = append(env, "SLURM_RLIMIT_"+name+"="+mark+value)
	}
	// The last --propagate wins: Slurm's srun then sets none of its own over these.
	return env, []string{"--propagate=NONE"}
}

// propagateOption reads the step's last --propagate (options as SplitSrunArgs passes them on):
// the limits it names (all of Slurm's without one, as PropagateResourceLimits then decides),
// whether the user asked, and false for a name Slurm does not know.
func propagateOption(options []string) (map[string]bool, bool, bool) {
	value, asked := "ALL", false
	for _, option := range options {
		if option == "--propagate" {
			value, asked = "ALL", true
		} else if given, ok := strings.CutPrefix(option, "--propagate="); ok {
			value, asked = given, true
		}
	}
	chosen := map[string]bool{}
	switch value {
	case "NONE":
		return chosen, asked, true
	case "ALL":
		for _, name := range startlimits.SlurmNames() {
			chosen[name] = true
		}
		return chosen, asked, true
	}
	for _, word := range strings.FieldsFunc(value, func(r rune) bool { return strings.ContainsRune(", \t\n", r) }) {
		name := strings.TrimPrefix(word, "RLIMIT_")
		if !startlimits.Propagated(name) {
			return nil, asked, false
		}
		chosen[name] = true
	}
	return chosen, asked, true
}

// isCount: a limit as srun writes one (decimal, an unsigned 64-bit number).
func isCount(value string) bool {
	_, err := strconv.ParseUint(value, 10, 64)
	return err == nil
}

// umaskOf is a umask as srun writes one ("0%o%o%o"), from an octal number as slurmstepd reads
// it (strtol, base 8); "" for anything else.
func umaskOf(value string) string {
	mask, err := strconv.ParseUint(value, 8, 32)
	if err != nil || mask > 0o777 {
		return ""
	}
	return fmt.Sprintf("%04o", mask)
}
