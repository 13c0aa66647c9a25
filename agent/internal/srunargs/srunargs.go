// Package srunargs reads srun's command line as srun does (bridge/core/srun_options.py): which
// options a step of a bridged job may use, and where the command starts. The waiter refuses a
// step with any other before it runs Slurm's srun; the pod's srun reads its --input here.
package srunargs

import (
	"strconv"
	"strings"
)

// Messages are srun's wording, as the Python module writes them.

const notHere = "is not available in a job that runs in Kubernetes"

var srunPassed = map[string]int{
	"nodes": 1, "ntasks": 1, "ntasks-per-node": 1, "cpus-per-task": 1, "nodelist": 1, "exclude": 1,
	"job-name": 1, "time": 1, "time-min": 1, "mem": 1, "mem-per-cpu": 1, "mem-per-gpu": 1, "gres": 1,
	"gres-flags": 1, "gpus": 1, "gpus-per-node": 1, "gpus-per-task": 1, "gpus-per-socket": 1,
	"cpus-per-gpu": 1, "distribution": 1, "mpi": 1, "cpu-bind": 1, "gpu-bind": 1, "mem-bind": 1,
	"hint": 1, "ntasks-per-gpu": 1, "ntasks-per-core": 1, "ntasks-per-socket": 1, "network": 1,
	"relative": 1, "wait": 1, "constraint": 1, "mincpus": 1, "sockets-per-node": 1,
	"cores-per-socket": 1, "threads-per-core": 1, "extra-node-info": 1, "tres-per-task": 1,
	"tres-bind": 1, "comment": 1, "signal": 1, "threads": 1, "ignore-signals": 1, "acctg-freq": 1,
	"account": 1, "partition": 1, "qos": 1, "reservation": 1, "wckey": 1, "overlap": 2,
	"exclusive": 2, "label": 0, "kill-on-bad-exit": 2, "unbuffered": 0, "quiet": 0, "verbose": 0,
	"disable-status": 0, "whole": 0, "exact": 0, "overcommit": 0, "oversubscribe": 0,
	"contiguous": 0, "spread-job": 0, "use-min-nodes": 0, "wait-for-children": 0,
	"quit-on-interrupt": 0, "no-kill": 2, "resv-ports": 2, "immediate": 2, "preserve-env": 0,
	"propagate": 2, "oom-kill-step": 2, "external-launcher": 2,
	"cpu_bind": 1, "tasks-per-node": 1, "msg-timeout": 1, "treewidth": 1, "ntasks-per-tres": 1,
	"accel-bind": 1, "extra": 1, "prefer": 1, "test-only": 0,
	"deadline": 1, "delay-boot": 1, "licenses": 1, "mail-type": 1, "mail-user": 1, "mcs-label": 1, "nice": 2, "priority": 1, "reboot": 0, "tmp": 1, "core-spec": 1, "thread-spec": 1, "switches": 1, "cluster-constraint": 1, "consolidate-segments": 0, "segment": 1, "stepmgr": 0, "resources": 1, "begin": 1, "dependency": 1, "hold": 0, "spread-segments": 0,
}

var srunHonoured = map[string]int{"output": 1, "error": 1, "input": 1, "open-mode": 1, "chdir": 1, "export": 1, "multi-prog": 0}

const onHost = "it would run a program on the slurmd host, outside the job's pods"
const otherCluster = "it would run the step on another cluster, outside the job's pods"

var srunRefused = map[string]string{
	"prolog": onHost, "epilog": onHost, "task-prolog": onHost, "task-epilog": onHost,
	"bcast":          "it copies a file onto the step's nodes, which here are the slurmd hosts, not the pods",
	"bcast-exclude":  "it belongs to --bcast, which copies files onto the slurmd hosts",
	"send-libs":      "it copies libraries onto the slurmd hosts, not the pods",
	"compress":       "it belongs to --bcast, which copies files onto the slurmd hosts",
	"container":      "it runs the task in an OCI container on the slurmd host; the task runs in the job's pod image already",
	"container-id":   "it runs the task in an OCI container on the slurmd host",
	"container-type": "it runs the task in an OCI container on the slurmd host",
	"x11":            "it forwards X11 through the slurmd host",
	"cpu-freq":       "slurmstepd would set the slurmd host's CPU frequency, not the pods' node's",
	"gpu-freq":       "slurmstepd would set the slurmd host's GPU frequency, not the pods' node's",
	"bb":             "burst buffers are staged by Slurm on its own hosts, not in the pods",
	"bbf":            "it reads a burst buffer file on the slurmd host",
	"profile":        "slurmstepd would profile the slurmd host's proxies, not the pods' tasks",
	"slurmd-debug":   "slurmstepd's own debug log describes the slurmd host",
	"pty":            "a terminal for a step's task is not available in a bridged job yet",
	"jobid":          "a step of a bridged job runs in that job (the bridge names it to Slurm's srun)",
	"no-allocate":    "it is for Slurm's administrators",
	"het-group":      "heterogeneous steps are not available in a bridged job",
	"async":          "the bridge relays a step's output and end through its srun, which must wait",
	"parsable":       "it belongs to --async",
	"clusters":       otherCluster, "cluster": otherCluster,
	"pack-group":    "heterogeneous steps are not available in a bridged job",
	"nodefile":      "it would read the file on the slurmd host; name the nodes with --nodelist",
	"context":       "slurmstepd would set the SELinux context of the slurmd host's proxies, not the pods' tasks",
	"mem-update":    "slurmstepd would watch the slurmd host's memory, not the pods'",
	"interactive":   "it is salloc's interactive step (srun --pty from a login host runs one)",
	"debugger-test": "it is for Slurm's parallel debugger tests",
	"autocomplete":  "it is for a shell's completion on a login host",
}

var srunShort = map[byte]string{
	'N': "nodes", 'n': "ntasks", 'c': "cpus-per-task", 'w': "nodelist", 'x': "exclude", 'J': "job-name",
	't': "time", 'G': "gpus", 'm': "distribution", 'r': "relative", 'W': "wait", 'C': "constraint",
	'B': "extra-node-info", 'T': "threads", 'A': "account", 'p': "partition", 'q': "qos", 'l': "label",
	'K': "kill-on-bad-exit", 'u': "unbuffered", 'Q': "quiet", 'v': "verbose", 'X': "disable-status",
	'O': "overcommit", 's': "oversubscribe", 'k': "no-kill", 'I': "immediate", 'E': "preserve-env",
	'o': "output", 'e': "error", 'i': "input", 'D': "chdir", 'Z': "no-allocate", 'b': "begin",
	'd': "dependency", 'H': "hold", 'L': "licenses", 'M': "clusters", 'S': "core-spec", 'F': "nodefile",
	'h': "help", 'V': "version",
}

// srunInfo are the options with which srun only prints its help, usage or version and exits 0:
// the pod's srun has Slurm's srun on the slurmd host print them (the Slurm commands' door).
var srunInfo = map[string]int{"help": 0, "usage": 0, "version": 0}

var srunRefusedTakes = map[string]int{"no-allocate": 0, "async": 0, "parsable": 0, "x11": 2, "pty": 2,
	"send-libs": 2, "compress": 2, "bcast": 2, "interactive": 0, "debugger-test": 0}

// getoptOrder is every long option Slurm 26.05's srun knows (src/common/slurm_opt.c), in its
// getopt table's order: an abbreviation is resolved against all of them, and an ambiguous one
// names them in this order.
var getoptOrder = []string{
	"accel-bind", "account", "acctg-freq", "async", "autocomplete", "bcast", "bcast-exclude", "begin",
	"bb", "bbf", "cluster-constraint", "chdir", "cluster", "clusters", "comment", "compress",
	"consolidate-segments", "container", "container-id", "container-type", "context", "contiguous",
	"constraint", "core-spec", "cores-per-socket", "cpu-bind", "cpu_bind", "cpu-freq", "cpus-per-gpu",
	"cpus-per-task", "deadline", "debugger-test", "delay-boot", "dependency", "disable-status",
	"distribution", "epilog", "error", "exact", "exclude", "exclusive", "export", "external-launcher",
	"extra", "extra-node-info", "gpu-bind", "gpu-freq", "gpus", "gpus-per-node", "gpus-per-socket",
	"gpus-per-task", "gres", "gres-flags", "help", "het-group", "hint", "hold", "ignore-signals",
	"immediate", "input", "interactive", "jobid", "job-name", "kill-on-bad-exit", "label", "licenses",
	"mail-type", "mail-user", "threads", "mcs-label", "mem", "mem-bind", "mem-per-cpu", "mem-per-gpu",
	"mem-update", "mincpus", "mpi", "msg-timeout", "multi-prog", "network", "nice", "no-allocate",
	"no-kill", "nodefile", "nodelist", "nodes", "ntasks", "ntasks-per-core", "ntasks-per-gpu",
	"ntasks-per-node", "ntasks-per-socket", "ntasks-per-tres", "oom-kill-step", "open-mode", "output",
	"overcommit", "overlap", "oversubscribe", "pack-group", "parsable", "partition", "prefer",
	"preserve-env", "priority", "profile", "prolog", "propagate", "pty", "qos", "quiet",
	"quit-on-interrupt", "reboot", "relative", "resources", "reservation", "resv-ports", "segment",
	"send-libs", "signal", "slurmd-debug", "sockets-per-node", "spread-job", "spread-segments",
	"stepmgr", "switches", "task-epilog", "task-prolog", "tasks-per-node", "test-only", "thread-spec",
	"threads-per-core", "time", "time-min", "tmp", "treewidth", "tres-bind", "tres-per-task",
	"unbuffered", "use-min-nodes", "verbose", "version", "usage", "wait", "wait-for-children", "wckey",
	"whole", "x11",
}

// sameOption are spellings getopt_long does not count apart when an abbreviation matches both.
var sameOption = map[string]string{"cpu_bind": "cpu-bind", "tasks-per-node": "ntasks-per-node", "pack-group": "het-group"}

const tryHelp = "Try \"srun --help\" for more information"

// getoptError is a command line srun's getopt_long refuses, in its words (exit 255).
func getoptError(line string) Error { return Error("srun: " + line + "\n" + tryHelp) }

// srunTakes is how many values each option takes: 0 none, 1 one, 2 optional (attached).
func srunTakes(name string) (int, bool) {
	if n, ok := srunPassed[name]; ok {
		return n, true
	}
	if n, ok := srunHonoured[name]; ok {
		return n, true
	}
	if n, ok := srunInfo[name]; ok {
		return n, true
	}
	if _, ok := srunRefused[name]; ok {
		if n, ok := srunRefusedTakes[name]; ok {
			return n, true
		}
		return 1, true
	}
	return 0, false
}

// Error is a refusal in srun's words; fatal ones end srun with 1, the others with 255.
type Error string

func (e Error) Error() string { return string(e) }

// ExitCode is srun's exit code natively for this refusal.
func (e Error) ExitCode() int {
	if strings.HasPrefix(string(e), "srun: fatal:") {
		return 1
	}
	return 255
}

// resolveLong is the option `--given` names: itself, or the one option it is a prefix of, as
// getopt_long reads abbreviations; getopt's error (word as written) for one naming none or several.
func resolveLong(given, word string) (string, error) {
	if _, ok := srunTakes(given); ok {
		return given, nil
	}
	var matches []string
	for _, name := range getoptOrder {
		if strings.HasPrefix(name, given) {
			matches = append(matches, name)
		}
	}
	if len(matches) == 0 {
		return "", getoptError("unrecognized option '" + word + "'")
	}
	// As glibc: a match that is the first one's option under another name is no ambiguity, nor
	// listed; any other is.
	option := func(name string) string {
		if same, ok := sameOption[name]; ok {
			return same
		}
		return name
	}
	listed := []string{matches[0]}
	for _, name := range matches[1:] {
		if option(name) != option(matches[0]) {
			listed = append(listed, name)
		}
	}
	if len(listed) == 1 {
		return matches[0], nil
	}
	line := "option '" + word + "' is ambiguous; possibilities:"
	for _, name := range listed {
		line += " '--" + name + "'"
	}
	return "", getoptError(line)
}

// longName is the option `--word` names, or word itself when getopt would refuse it.
func longName(word string) string {
	if name, err := resolveLong(word, "--"+word); err == nil {
		return name
	}
	return word
}

// Split reads srun's options and command as srun does: the options Slurm's srun gets, and the
// command; an Error for an option a bridged step cannot take, or no command.
func Split(argv []string) ([]string, []string, error) {
	passed, command, _, err := split(argv)
	return passed, command, err
}

// Input is the step's last --input (srun's own option, before the command), and whether one was
// given; "" and false for a command line srun would refuse.
func Input(argv []string) (string, bool) {
	_, _, input, err := split(argv)
	if err != nil || input == nil {
		return "", false
	}
	return *input, true
}

func split(argv []string) ([]string, []string, *string, error) {
	var passed []string
	var input *string
	take := func(name string, value *string) error {
		if _, info := srunInfo[name]; info {
			// The pod's srun has these answered before it asks for a step (an older one asks).
			return Error("srun: error: option --" + name + " is answered by the job's own srun, not in a step")
		}
		if reason, refused := srunRefused[name]; refused {
			return Error("srun: error: option --" + name + " " + notHere + ": " + reason)
		}
		if (name == "nodelist" || name == "exclude") && value != nil && strings.Contains(*value, "/") {
			return Error("srun: error: option --" + name + " " + notHere + ": a node list with a / names a file, which Slurm's srun would read on the slurmd host; name the nodes")
		}
		if name == "mpi" && (value == nil || *value != "none") {
			shown := "None"
			if value != nil {
				shown = *value
			}
			return Error("srun: error: --mpi=" + shown + " " + notHere +
				": start MPI programs with mpirun (it starts its daemons by srun)")
		}
		switch name {
		case "output", "error", "input":
			if value == nil || *value == "" {
				return Error("srun: error: option --" + name + " needs a file name")
			}
			if name == "input" {
				input = value
			}
		case "open-mode":
			ok := false
			for _, mode := range []string{"append", "truncate"} {
				ok = ok || value != nil && *value != "" && strings.HasPrefix(mode, strings.ToLower(*value))
			}
			if !ok {
				shown := "None"
				if value != nil {
					shown = *value
				}
				return Error("srun: error: Invalid --open-mode argument: " + shown + ". Ignored")
			}
		case "chdir", "export", "multi-prog":
		default:
			if value == nil {
				passed = append(passed, "--"+name)
			} else {
				passed = append(passed, "--"+name+"="+*value)
			}
		}
		return nil
	}
	i := 0
	for i < len(argv) {
		word := argv[i]
		i++
		if word == "--" {
			break
		}
		if !strings.HasPrefix(word, "-") || word == "-" {
			i--
			break
		}
		if strings.HasPrefix(word, "--") {
			given, value, eq := strings.Cut(word[2:], "=")
			name, err := resolveLong(given, word)
			if err != nil {
				return nil, nil, nil, err
			}
			takes, _ := srunTakes(name)
			if takes == 0 && eq {
				return nil, nil, nil, getoptError("option '--" + name + "' doesn't allow an argument")
			}
			hasValue := eq
			if takes == 1 && !eq {
				if i >= len(argv) {
					return nil, nil, nil, getoptError("option '--" + name + "' requires an argument")
				}
				value, hasValue = argv[i], true
				i++
			}
			var given2 *string
			if hasValue {
				given2 = &value
			}
			if err := take(name, given2); err != nil {
				return nil, nil, nil, err
			}
			continue
		}
		for j := 1; j < len(word); j++ {
			name, ok := srunShort[word[j]]
			if !ok {
				return nil, nil, nil, getoptError("invalid option -- '" + word[j:j+1] + "'")
			}
			rest := word[j+1:]
			takes, _ := srunTakes(name)
			if takes == 0 || takes == 2 && rest == "" {
				if err := take(name, nil); err != nil {
					return nil, nil, nil, err
				}
				continue
			}
			var err error
			switch {
			case takes == 2 || rest != "":
				err = take(name, &rest)
			case i < len(argv):
				value := argv[i]
				i++
				err = take(name, &value)
			default:
				err = getoptError("option requires an argument -- '" + word[j:j+1] + "'")
			}
			if err != nil {
				return nil, nil, nil, err
			}
			break
		}
	}
	command := argv[i:]
	if len(command) == 0 {
		return nil, nil, nil, Error("srun: fatal: No command given to execute.")
	}
	return passed, command, input, nil
}

// longOption is one long option of srun's own, before the command: argv[first:end], its name
// (an abbreviation resolved) and value.
type longOption struct {
	first, end int
	name       string
	value      string
	attached   bool // --name=value
}

// longOptions are srun's own long options in argv, as srun reads them, and where the command starts.
func longOptions(argv []string) ([]longOption, int) {
	var found []longOption
	i := 0
	for i < len(argv) {
		word := argv[i]
		if word == "--" || !strings.HasPrefix(word, "-") || word == "-" {
			break
		}
		i++
		if strings.HasPrefix(word, "--") {
			given, value, eq := strings.Cut(word[2:], "=")
			option := longOption{first: i - 1, name: longName(given), value: value, attached: eq}
			if takes, _ := srunTakes(option.name); takes == 1 && !eq && i < len(argv) {
				option.value = argv[i]
				i++
			}
			option.end = i
			found = append(found, option)
			continue
		}
		for j := 1; j < len(word); j++ {
			if takes, _ := srunTakes(srunShort[word[j]]); takes == 1 || takes == 2 {
				if takes == 1 && j+1 == len(word) && i < len(argv) {
					i++
				}
				break
			}
		}
	}
	return found, i
}

// without is argv less the words of `dropped`.
func without(argv []string, dropped []longOption) []string {
	out := make([]string, 0, len(argv))
	next := 0
	for _, option := range dropped {
		out = append(out, argv[next:option.first]...)
		next = option.end
	}
	return append(out, argv[next:]...)
}

// WithoutPty is argv without its --pty options (srun's own, before the command) when the
// terminal they name (stdin, or --pty=FD) is not one (windowSize, srun's TIOCGWINSZ, fails), as
// native srun then says on stderr and runs the step without it: the words left and srun's lines,
// or argv unchanged and "". A --pty on a terminal stays (refused: no terminal for a script's step).
func WithoutPty(argv []string, windowSize func(fd int) error) ([]string, string) {
	options, _ := longOptions(argv)
	var ptys []longOption
	for _, option := range options {
		if option.name == "pty" {
			ptys = append(ptys, option)
		}
	}
	if len(ptys) == 0 {
		return argv, ""
	}
	last, fd, shown := ptys[len(ptys)-1], 0, ""
	if last.attached {
		number, err := strconv.Atoi(last.value)
		if err != nil || number < 0 {
			return argv, "" // srun's own refusal, later
		}
		fd, shown = number, "="+last.value
	}
	err := windowSize(fd)
	if err == nil {
		return argv, ""
	}
	// As srun's error("...: %m"): strerror's wording, capitalised.
	reason := err.Error()
	if reason != "" {
		reason = strings.ToUpper(reason[:1]) + reason[1:]
	}
	return without(argv, ptys), "srun: error: ioctl(TIOCGWINSZ): " + reason + "\n" +
		"srun: error: Not using a pseudo-terminal, disregarding --pty" + shown + " option\n"
}

// WithoutOwnJobID is argv without its --jobid options that name jobID, the job the step runs in
// anyway (native srun takes them inside a job as nothing more); another job's stays (refused).
func WithoutOwnJobID(argv []string, jobID string) []string {
	options, _ := longOptions(argv)
	var own []longOption
	for _, option := range options {
		if option.name == "jobid" {
			if option.value != jobID || jobID == "" {
				return argv
			}
			own = append(own, option)
		}
	}
	if len(own) == 0 {
		return argv
	}
	return without(argv, own)
}

// Info is the first of srun's own options before the command with which srun only prints its help,
// usage, version or MPI plugins ("--help", "--usage", "--version", "--mpi=list"), as srun reads its
// command line: srun acts on it when getopt reaches it, so what comes before must read without
// error. "" when there is none.
func Info(argv []string) string {
	// --mpi=list is acted on once all the options are read (the last --mpi wins); the others as
	// getopt reaches them.
	lastMPI := ""
	atCommand := func() string {
		if lastMPI == "list" {
			return "--mpi=list"
		}
		return ""
	}
	for i := 0; i < len(argv); {
		word := argv[i]
		i++
		if word == "--" || !strings.HasPrefix(word, "-") || word == "-" {
			return atCommand()
		}
		if strings.HasPrefix(word, "--") {
			given, value, eq := strings.Cut(word[2:], "=")
			name, err := resolveLong(given, word)
			if err != nil {
				return ""
			}
			takes, _ := srunTakes(name)
			if takes == 0 && eq {
				return "" // getopt's "doesn't allow an argument"
			}
			if _, info := srunInfo[name]; info {
				return "--" + name
			}
			if takes == 1 && !eq {
				if i >= len(argv) {
					return "" // getopt's "requires an argument"
				}
				value = argv[i]
				i++
			}
			if name == "mpi" {
				lastMPI = value
			}
			continue
		}
		for j := 1; j < len(word); j++ {
			name, known := srunShort[word[j]]
			if !known {
				return ""
			}
			if _, info := srunInfo[name]; info {
				return "--" + name
			}
			if takes, _ := srunTakes(name); takes == 1 || takes == 2 {
				if takes == 1 && j+1 == len(word) {
					if i >= len(argv) {
						return ""
					}
					i++
				}
				break
			}
		}
	}
	return atCommand()
}
