package waiter

// The tables of bridge/core/slurm_commands.py: which Slurm commands the pod may ask for, every
// option each binary knows (as its getopt string and long-option table have them), and those
// refused with the reason the user reads. TestSlurmCommandTablesDump writes them for
// tests/unit/test_the_waiters_slurm_commands_follow_the_daemons_tables.py, which checks that they
// equal the daemon's (bridge/core/slurm_commands.py): the daemon checks with those, the waiter
// again with these.

// arity is how an option takes a value, as getopt_long's has_arg says.
type arity int

const (
	noArg  arity = iota // --x, -x
	reqArg              // --x=v or --x v, -xv or -x v
	optArg              // only as --x=v
)

// slurmCommands are the binaries the pod may have run, in the order the refusal names them; srun
// only for its help, usage, version and --mpi=list (the pod's srun asks so: its steps come another way).
var slurmCommands = []string{"scontrol", "squeue", "sbatch", "scancel", "sacct", "sinfo", "sstat", "srun"}

// slurmBinaryDirs are where Slurm's binaries are looked for, by absolute path (never the job's PATH).
var slurmBinaryDirs = []string{"/usr/bin", "/usr/local/bin", "/opt/slurm/bin"}

const (
	maxCommandArgs      = 256
	maxCommandArgvBytes = 64 * 1024
	// A script sbatch gets from the pod: base64 twice over, with the environment, it must fit
	// one log line the daemon reads whole.
	maxSbatchScriptBytes = 512 * 1024
)

var shortOptions = map[string]map[string]arity{
	"squeue": {
		"A": reqArg, "a": noArg, "h": noArg, "i": reqArg, "j": reqArg, "l": noArg, "L": reqArg,
		"M": reqArg, "n": reqArg, "o": reqArg, "O": reqArg, "p": reqArg, "q": reqArg, "R": reqArg,
		"r": noArg, "s": reqArg, "S": reqArg, "t": reqArg, "u": reqArg, "v": noArg, "V": noArg,
		"w": reqArg,
	},
	"sinfo": {
		"a": noArg, "d": noArg, "e": noArg, "F": noArg, "h": noArg, "i": reqArg, "l": noArg, "M": reqArg,
		"n": reqArg, "N": noArg, "o": reqArg, "O": reqArg, "p": reqArg, "r": noArg, "R": noArg,
		"s": noArg, "S": reqArg, "t": reqArg, "T": noArg, "v": noArg, "V": noArg,
	},
	"sacct": {
		"a": noArg, "A": reqArg, "b": noArg, "B": noArg, "c": noArg, "D": noArg, "e": noArg, "E": reqArg,
		"f": reqArg, "g": reqArg, "h": noArg, "i": reqArg, "I": reqArg, "j": reqArg, "k": reqArg,
		"K": reqArg, "l": noArg, "L": noArg, "M": reqArg, "n": noArg, "N": reqArg, "o": reqArg,
		"p": noArg, "P": noArg, "q": reqArg, "r": reqArg, "R": reqArg, "s": reqArg, "S": reqArg,
		"T": noArg, "u": reqArg, "v": noArg, "V": noArg, "W": reqArg, "x": reqArg, "X": noArg,
	},
	"scancel": {
		"A": reqArg, "b": noArg, "c": noArg, "f": noArg, "H": noArg, "i": noArg, "M": reqArg,
		"n": reqArg, "p": reqArg, "Q": noArg, "q": reqArg, "R": reqArg, "s": reqArg, "t": reqArg,
		"u": reqArg, "V": noArg, "v": noArg, "w": reqArg,
	},
	"scontrol": {
		"a": noArg, "d": noArg, "F": noArg, "h": noArg, "M": reqArg, "o": noArg, "Q": noArg, "u": reqArg,
		"v": noArg, "V": noArg,
	},
	"sstat": {
		"a": noArg, "e": noArg, "h": noArg, "i": noArg, "j": reqArg, "n": noArg, "o": reqArg, "p": noArg,
		"P": noArg, "v": noArg, "V": noArg,
	},
	"srun": {"h": noArg, "V": noArg},
	"sbatch": {
		"a": reqArg, "A": reqArg, "b": reqArg, "B": reqArg, "c": reqArg, "C": reqArg, "d": reqArg,
		"D": reqArg, "e": reqArg, "F": reqArg, "G": reqArg, "H": noArg, "h": noArg, "i": reqArg,
		"J": reqArg, "k": noArg, "L": reqArg, "M": reqArg, "m": reqArg, "n": reqArg, "N": reqArg,
		"o": reqArg, "O": noArg, "p": reqArg, "q": reqArg, "Q": noArg, "s": noArg, "S": reqArg,
		"t": reqArg, "V": noArg, "v": noArg, "W": noArg, "w": reqArg, "x": reqArg,
	},
}

var longOptions = map[string]map[string]arity{
	"squeue": {
		"account": reqArg, "all": noArg, "federation": noArg, "noheader": noArg, "hide": noArg,
		"iterate": reqArg, "job": reqArg, "jobs": reqArg, "json": optArg, "local": noArg, "long": noArg,
		"licenses": reqArg, "clusters": reqArg, "cluster": reqArg, "name": reqArg, "noconvert": noArg,
		"format": reqArg, "Format": reqArg, "only-job-state": noArg, "partition": reqArg, "qos": reqArg,
		"reservation": reqArg, "array": noArg, "array-unique": noArg, "running-over": reqArg,
		"running-under": reqArg, "sibling": noArg, "step": reqArg, "steps": reqArg, "sort": reqArg,
		"start": noArg, "states": reqArg, "state": reqArg, "user": reqArg, "users": reqArg, "me": noArg,
		"verbose": noArg, "nodelist": reqArg, "nodes": reqArg, "yaml": optArg, "helpformat": noArg,
		"helpFormat": noArg, "helpstate": noArg, "help": noArg, "usage": noArg, "version": noArg,
	},
	"sinfo": {
		"all": noArg, "dead": noArg, "exact": noArg, "federation": noArg, "future": noArg,
		"noheader": noArg, "hide": noArg, "iterate": reqArg, "json": optArg, "local": noArg,
		"long": noArg, "clusters": reqArg, "cluster": reqArg, "nodes": reqArg, "noconvert": noArg,
		"Node": noArg, "format": reqArg, "Format": reqArg, "partition": reqArg, "responding": noArg,
		"list-reasons": noArg, "summarize": noArg, "sort": reqArg, "states": reqArg,
		"reservation": noArg, "verbose": noArg, "yaml": optArg, "helpformat": noArg, "helpFormat": noArg,
		"helpstate": noArg, "help": noArg, "usage": noArg, "version": noArg,
	},
	"sacct": {
		"allusers": noArg, "accounts": reqArg, "array": noArg, "brief": noArg, "batch-script": noArg,
		"completion": noArg, "delimiter": reqArg, "duplicates": noArg, "helpformat": noArg,
		"endtime": reqArg, "env-vars": noArg, "federation": noArg, "expand-pattern": noArg,
		"file": reqArg, "gid": reqArg, "group": reqArg, "helpreason": noArg, "helpstate": noArg,
		"nnodes": reqArg, "ncpus": reqArg, "jobs": reqArg, "json": optArg, "timelimit-min": reqArg,
		"timelimit-max": reqArg, "local": noArg, "long": noArg, "allclusters": noArg, "clusters": reqArg,
		"noheader": noArg, "noconvert": noArg, "nodelist": reqArg, "name": reqArg, "format": reqArg,
		"parsable": noArg, "parsable2": noArg, "qos": reqArg, "partition": reqArg, "reason": reqArg,
		"state": reqArg, "starttime": reqArg, "truncate": noArg, "uid": reqArg, "user": reqArg,
		"units": reqArg, "verbose": noArg, "wckeys": reqArg, "whole-hetjob": optArg,
		"associations": reqArg, "allocations": noArg, "yaml": optArg, "me": noArg, "help": noArg,
		"usage": noArg, "version": noArg,
	},
	"scancel": {
		"account": reqArg, "admin-comment": reqArg, "batch": noArg, "ctld": noArg, "cron": noArg,
		"full": noArg, "hurry": noArg, "interactive": noArg, "clusters": reqArg, "cluster": reqArg,
		"name": reqArg, "jobname": reqArg, "partition": reqArg, "quiet": noArg, "qos": reqArg,
		"reservation": reqArg, "sibling": reqArg, "signal": reqArg, "state": reqArg, "user": reqArg,
		"me": noArg, "verbose": noArg, "nodelist": reqArg, "wckey": reqArg, "help": noArg,
		"usage": noArg, "version": noArg,
	},
	"scontrol": {
		"all": noArg, "details": noArg, "federation": noArg, "future": noArg, "hide": noArg,
		"json": optArg, "local": noArg, "cluster": reqArg, "clusters": reqArg, "oneliner": noArg,
		"quiet": noArg, "sibling": noArg, "uid": reqArg, "verbose": noArg, "yaml": optArg, "help": noArg,
		"usage": noArg, "version": noArg,
	},
	"sstat": {
		"autocomplete": reqArg, "allsteps": noArg, "helpformat": noArg, "jobs": reqArg, "noheader": noArg,
		"fields": reqArg, "format": reqArg, "noconvert": noArg, "pidformat": noArg, "parsable": noArg,
		"parsable2": noArg, "verbose": noArg, "help": noArg, "usage": noArg, "version": noArg,
	},
	"srun": {"mpi": reqArg, "help": noArg, "usage": noArg, "version": noArg},
	"sbatch": {
		"array": reqArg, "account": reqArg, "bb": reqArg, "bbf": reqArg, "begin": reqArg,
		"comment": reqArg, "cpu-freq": reqArg, "cpus-per-task": reqArg, "dependency": reqArg,
		"deadline": reqArg, "delay-boot": reqArg, "chdir": reqArg, "error": reqArg, "export": optArg,
		"export-file": reqArg, "get-user-env": optArg, "gid": reqArg, "gres": reqArg,
		"gres-flags": reqArg, "hold": noArg, "ignore-pbs": noArg, "input": reqArg, "job-name": reqArg,
		"no-kill": optArg, "licenses": reqArg, "clusters": reqArg, "cluster": reqArg,
		"distribution": reqArg, "mail-type": reqArg, "mail-user": reqArg, "mcs-label": reqArg,
		"ntasks": reqArg, "nice": optArg, "no-requeue": noArg, "ntasks-per-node": reqArg,
		"nodes": reqArg, "oom-kill-step": optArg, "output": reqArg, "overcommit": noArg,
		"partition": reqArg, "parsable": noArg, "power": reqArg, "priority": reqArg, "profile": reqArg,
		"propagate": optArg, "qos": reqArg, "quiet": noArg, "reboot": noArg, "requeue": optArg,
		"oversubscribe": noArg, "core-spec": reqArg, "signal": reqArg, "spread-job": noArg,
		"spread-segments": noArg, "switches": reqArg, "thread-spec": reqArg, "time": reqArg,
		"time-min": reqArg, "tres-bind": reqArg, "tres-per-task": reqArg, "uid": reqArg,
		"use-min-nodes": noArg, "verbose": noArg, "wait": noArg, "wckey": reqArg, "wrap": reqArg,
		"cluster-constraint": reqArg, "contiguous": noArg, "constraint": reqArg, "nodefile": reqArg,
		"mem": reqArg, "mincpus": reqArg, "reservation": reqArg, "tmp": reqArg, "nodelist": reqArg,
		"exclude": reqArg, "container": reqArg, "container-id": reqArg, "exclusive": optArg,
		"mem-per-cpu": reqArg, "resv-ports": optArg, "sockets-per-node": reqArg,
		"cores-per-socket": reqArg, "threads-per-core": reqArg, "extra-node-info": reqArg,
		"ntasks-per-core": reqArg, "ntasks-per-socket": reqArg, "cpus-per-gpu": reqArg, "gpus": reqArg,
		"gpu-bind": reqArg, "gpu-freq": reqArg, "gpus-per-node": reqArg, "gpus-per-socket": reqArg,
		"gpus-per-task": reqArg, "mem-per-gpu": reqArg, "extra": reqArg, "test-only": noArg,
		"kill-on-invalid-dep": reqArg, "acctg-freq": reqArg, "hint": reqArg, "mem-bind": reqArg,
		"network": reqArg, "prefer": reqArg, "segment": reqArg, "ntasks-per-gpu": reqArg,
		"batch": reqArg, "open-mode": reqArg, "cpus-per-gres": reqArg, "help": noArg, "usage": noArg,
		"version": noArg,
	},
}

// shortIsRefusedLong are short options that are the same as a refused long one.
var shortIsRefusedLong = map[string]map[string]string{"sbatch": {"F": "nodefile"}, "sacct": {"f": "file"}}

const readsHostFile = "it would read a file on the slurmd host, where nothing of a bridged job's user is"

// refusedOptions are the options refused, with the reason the user reads.
var refusedOptions = map[string]map[string]string{
	"sbatch": {
		"export-file": "the job's environment in the pod is exported already (choose with --export)",
		"get-user-env": "it runs the user's login shell (su -) on the host that starts the job; " +
			"a bridged job's pod gets the exported variables and the image's own",
		"bbf":      readsHostFile + "; give the burst buffer specification with --bb",
		"nodefile": readsHostFile + "; name the nodes with --nodelist",
	},
	"sacct": {"file": readsHostFile},
}

// scontrolVerbs only ask slurmctld, which applies its own permissions to the user.
var scontrolVerbs = []string{"show", "hold", "holdu", "uhold", "release", "requeue", "requeuehold", "suspend",
	"resume", "update", "notify", "top", "ping", "version", "help", "errnumstr", "wait_job"}

// scontrolHostVerbs are about (or write files on) the host scontrol runs on: the slurmd host here.
var scontrolHostVerbs = []string{"listpids", "listjobs", "liststeps", "pidinfo", "getent", "write"}

// infoOnlyOptions make sbatch, scontrol and srun only print their help or version.
var infoOnlyOptions = map[string][]string{
	"sbatch":   {"help", "h", "usage", "version", "V"},
	"scontrol": {"help", "h", "usage", "version", "V"},
	"srun":     {"help", "h", "usage", "version", "V"},
}

// pluginNameCharacters are those of a data_parser plugin's name (--json=, --yaml=): a name, never a path.
const pluginNameCharacters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,+_-"
