"""The srun options a step of a bridged job may use, and how srun reads its command line. The
waiter refuses a step with any other before it runs Slurm's srun (agent/internal/waiter/srun_options.go); the
daemon checks the same when it takes the request (bridge/controller/steps.py) and before it runs the
step's command in the pods (bridge/manager/api.py). docs/srun-options.md is the table of them all.

Slurm's srun runs on the slurmd host with the task proxies as its program, so an option reaches
the pods in one of three ways: Slurm's srun gets it as the user gave it (layout, labels, exit
handling: PASSED); the bridge does what slurmstepd would with it (the per-step files, --chdir,
--export, --multi-prog: HONOURED, see bridge/core/step_request.py); or it is refused with its
reason, because it would run or read something on the slurmd host (REFUSED).

Pure and standard library only: the waiter imports it at every job start (see waiter_protocol).
"""

from __future__ import annotations

NOT_HERE = "is not available in a job that runs in Kubernetes"

# name -> how many values it takes: 0 none, 1 one (attached or next word), 2 optional (attached).
PASSED = {
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
    "propagate": 2, "oom-kill-step": 2,
    "external-launcher": 2,  # what mpirun (Open MPI, MPICH hydra) adds to start its daemons
    # Native srun takes these too (Parsl's SrunLauncher and sites' wrappers use some): the old
    # spellings of two options, the step's RPC timeout and fan-out, tasks per GPU-like resource.
    "cpu_bind": 1, "tasks-per-node": 1, "msg-timeout": 1, "treewidth": 1, "ntasks-per-tres": 1,
    # Inside an allocation Slurm's srun takes these as natively: the binding of GPU-like resources
    # to tasks; a job's extra field, preferred features and test-only, which a step ignores or
    # answers as natively.
    "accel-bind": 1, "extra": 1, "prefer": 1, "test-only": 0,
    # A job's own options: inside the allocation Slurm's srun ignores them, some with a warning
    # (--begin, --core-spec, --thread-spec), as natively.
    "deadline": 1, "delay-boot": 1, "licenses": 1, "mail-type": 1, "mail-user": 1, "mcs-label": 1,
    "nice": 2, "priority": 1, "reboot": 0, "tmp": 1, "core-spec": 1, "thread-spec": 1, "switches": 1,
    "cluster-constraint": 1, "consolidate-segments": 0, "segment": 1, "stepmgr": 0, "resources": 1,
    "begin": 1, "dependency": 1, "hold": 0, "spread-segments": 0,
}
HONOURED = {"output": 1, "error": 1, "input": 1, "open-mode": 1, "chdir": 1, "export": 1, "multi-prog": 0}
_ON_HOST = "it would run a program on the slurmd host, outside the job's pods"
REFUSED = {
    "prolog": _ON_HOST, "epilog": _ON_HOST, "task-prolog": _ON_HOST, "task-epilog": _ON_HOST,
    "bcast": "it copies a file onto the step's nodes, which here are the slurmd hosts, not the pods",
    "bcast-exclude": "it belongs to --bcast, which copies files onto the slurmd hosts",
    "send-libs": "it copies libraries onto the slurmd hosts, not the pods",
    "compress": "it belongs to --bcast, which copies files onto the slurmd hosts",
    "container": "it runs the task in an OCI container on the slurmd host; the task runs in the job's "
                 "pod image already",
    "container-id": "it runs the task in an OCI container on the slurmd host",
    "container-type": "it runs the task in an OCI container on the slurmd host",
    "x11": "it forwards X11 through the slurmd host",
    "cpu-freq": "slurmstepd would set the slurmd host's CPU frequency, not the pods' node's",
    "gpu-freq": "slurmstepd would set the slurmd host's GPU frequency, not the pods' node's",
    "bb": "burst buffers are staged by Slurm on its own hosts, not in the pods",
    "bbf": "it reads a burst buffer file on the slurmd host",
    "profile": "slurmstepd would profile the slurmd host's proxies, not the pods' tasks",
    "slurmd-debug": "slurmstepd's own debug log describes the slurmd host",
    "pty": "a terminal for a step's task is not available in a bridged job yet",
    "jobid": "a step of a bridged job runs in that job (the bridge names it to Slurm's srun)",
    "no-allocate": "it is for Slurm's administrators",
    "het-group": "heterogeneous steps are not available in a bridged job",
    "async": "the bridge relays a step's output and end through its srun, which must wait",
    "parsable": "it belongs to --async",
    "pack-group": "heterogeneous steps are not available in a bridged job",
    "nodefile": "it would read the file on the slurmd host; name the nodes with --nodelist",
    "context": "slurmstepd would set the SELinux context of the slurmd host's proxies, not the pods' tasks",
    "mem-update": "slurmstepd would watch the slurmd host's memory, not the pods'",
    "interactive": "it is salloc's interactive step (srun --pty from a login host runs one)",
    "debugger-test": "it is for Slurm's parallel debugger tests",
    "autocomplete": "it is for a shell's completion on a login host",
}
for _name in ("clusters", "cluster"):
    REFUSED[_name] = "it would run the step on another cluster, outside the job's pods"
SHORT = {
    "N": "nodes", "n": "ntasks", "c": "cpus-per-task", "w": "nodelist", "x": "exclude", "J": "job-name",
    "t": "time", "G": "gpus", "m": "distribution", "r": "relative", "W": "wait", "C": "constraint",
    "B": "extra-node-info", "T": "threads", "A": "account", "p": "partition", "q": "qos", "l": "label",
    "K": "kill-on-bad-exit", "u": "unbuffered", "Q": "quiet", "v": "verbose", "X": "disable-status",
    "O": "overcommit", "s": "oversubscribe", "k": "no-kill", "I": "immediate", "E": "preserve-env",
    "o": "output", "e": "error", "i": "input", "D": "chdir", "Z": "no-allocate", "b": "begin",
    "d": "dependency", "H": "hold", "L": "licenses", "M": "clusters", "S": "core-spec", "F": "nodefile",
    "h": "help", "V": "version",
}
INFO = {"help": 0, "usage": 0, "version": 0}
"""Options with which srun only prints its help, usage or version and exits 0: the pod's srun has
Slurm's srun on the slurmd host print them (through the Slurm commands' door, slurm_commands.py)."""
_REFUSED_TAKES = {"no-allocate": 0, "async": 0, "parsable": 0, "x11": 2, "pty": 2, "send-libs": 2,
                  "compress": 2, "bcast": 2, "interactive": 0, "debugger-test": 0}
_TAKES = {**PASSED, **HONOURED, **INFO, **{name: _REFUSED_TAKES.get(name, 1) for name in REFUSED}}
GETOPT_ORDER = (
    "accel-bind", "account", "acctg-freq", "async", "autocomplete", "bcast", "bcast-exclude", "begin", "bb",
    "bbf", "cluster-constraint", "chdir", "cluster", "clusters", "comment", "compress",
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
    "send-libs", "signal", "slurmd-debug", "sockets-per-node", "spread-job", "spread-segments", "stepmgr",
    "switches", "task-epilog", "task-prolog", "tasks-per-node", "test-only", "thread-spec",
    "threads-per-core", "time", "time-min", "tmp", "treewidth", "tres-bind", "tres-per-task", "unbuffered",
    "use-min-nodes", "verbose", "version", "usage", "wait", "wait-for-children", "wckey", "whole", "x11",
)
"""Every long option Slurm 26.05's srun knows (src/common/slurm_opt.c), in its getopt table's order:
an abbreviation is resolved against all of them, and an ambiguous one names them in this order."""
SAME_OPTION = {"cpu_bind": "cpu-bind", "tasks-per-node": "ntasks-per-node", "pack-group": "het-group"}
"""Spellings getopt_long does not count apart when an abbreviation matches both (one option)."""
NODE_FILE = ("a node list with a / names a file, which Slurm's srun would read on the slurmd host; "
             "name the nodes")
TRY_HELP = "Try \"srun --help\" for more information"
OPEN_MODES = ("append", "truncate")


class SrunArgs:
    """A step request's srun command line, read as srun reads it."""

    __slots__ = ("chdir", "command", "export", "io", "multi_prog", "open_mode", "passed")

    def __init__(self) -> None:
        self.passed: list[str] = []
        """Options for Slurm's srun, each one word, `--name[=value]` (never the user's spelling)."""
        self.io: dict[str, str] = {}
        """"output", "error", "input" -> the file pattern as given (Slurm's %-patterns kept)."""
        self.open_mode = ""
        self.chdir = ""
        self.export = ""
        self.multi_prog = False
        self.command: list[str] = []


def getopt_error(line: str) -> ValueError:
    """A command line srun's getopt_long refuses, in its words (exit 255)."""
    return ValueError(f"srun: {line}\n{TRY_HELP}")


def _long_name(given: str, word: str) -> str:
    """The option `--given` names: itself, or the one option it is a prefix of, as getopt_long reads
    abbreviations; getopt's error (`word` as written) for one that names none or several."""
    if given in _TAKES:
        return given
    matches = [name for name in GETOPT_ORDER if name.startswith(given)]
    if not matches:
        raise getopt_error(f"unrecognized option '{word}'")
    # As glibc: a match that is the first one's option under another name is no ambiguity, nor
    # listed; any other is.
    first = SAME_OPTION.get(matches[0], matches[0])
    listed = [name for name in matches if name == matches[0] or SAME_OPTION.get(name, name) != first]
    if len(listed) == 1:
        return matches[0]
    possibilities = " ".join(f"'--{name}'" for name in listed)
    raise getopt_error(f"option '{word}' is ambiguous; possibilities: {possibilities}")


def refusal(option: str, reason: str) -> ValueError:
    return ValueError(f"srun: error: option {option} {NOT_HERE}: {reason}")


def parse_srun_args(argv: list[str]) -> SrunArgs:
    """srun's own options and the command, as srun reads them; ValueError (srun's wording and the
    reason) for an option a bridged step cannot take, or no command."""
    args = SrunArgs()
    i = 0
    while i < len(argv):
        word = argv[i]
        i += 1
        if word == "--":
            break
        if not word.startswith("-") or word == "-":
            i -= 1
            break
        if word.startswith("--"):
            given, eq, value = word[2:].partition("=")
            name = _long_name(given, word)
            takes = _TAKES[name]
            if takes == 0 and eq:
                raise getopt_error(f"option '--{name}' doesn't allow an argument")
            has_value = bool(eq)
            if takes == 1 and not eq:
                if i >= len(argv):
                    raise getopt_error(f"option '--{name}' requires an argument")
                value, has_value = argv[i], True
                i += 1
            _take(args, name, value if has_value else None)
            continue
        # -abc: flags in a cluster, the first option with a value takes the rest of the word
        j = 1
        while j < len(word):
            name = SHORT.get(word[j], "")
            if not name:
                raise getopt_error(f"invalid option -- '{word[j]}'")
            rest = word[j + 1:]
            takes = _TAKES[name]
            if takes == 0 or (takes == 2 and not rest):
                _take(args, name, None)
                j += 1
                continue
            if takes == 2 or rest:
                _take(args, name, rest)
            elif i < len(argv):
                _take(args, name, argv[i])
                i += 1
            else:
                raise getopt_error(f"option requires an argument -- '{word[j]}'")
            break
    args.command = argv[i:]
    if not args.command:
        raise ValueError("srun: fatal: No command given to execute.")
    return args


def _take(args: SrunArgs, name: str, value: str | None) -> None:
    if name in INFO:
        # The pod's srun has these answered before it asks for a step (an older one asks).
        raise ValueError(f"srun: error: option --{name} is answered by the job's own srun, not in a step")
    if name in REFUSED:
        raise refusal(f"--{name}", REFUSED[name])
    if name in ("nodelist", "exclude") and value and "/" in value:
        raise refusal(f"--{name}", NODE_FILE)
    if name == "mpi" and value != "none":
        # slurmstepd's PMI server lives on the slurmd host, out of the pods' reach.
        raise ValueError(f"srun: error: --mpi={value} {NOT_HERE}: start MPI programs with mpirun "
                         "(it starts its daemons by srun)")
    if name in ("output", "error", "input"):
        if not value:
            raise ValueError(f"srun: error: option --{name} needs a file name")
        args.io[name] = str(value)
    elif name == "open-mode":
        mode = next((m for m in OPEN_MODES if value and m.startswith(value.lower())), "")
        if not mode:
            raise ValueError(f"srun: error: Invalid --open-mode argument: {value}. Ignored")
        args.open_mode = mode
    elif name == "chdir":
        args.chdir = str(value)
    elif name == "export":
        args.export = str(value)
    elif name == "multi-prog":
        args.multi_prog = True
    else:
        args.passed.append(f"--{name}" if value is None else f"--{name}={value}")


def refused_exit_code(error: ValueError) -> int:
    """srun's exit code natively for what parse_srun_args refused: 255 for an option it cannot
    take, 1 for its fatal errors (no command)."""
    return 1 if str(error).startswith("srun: fatal:") else 255


def split_srun_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """The options Slurm's srun gets as given, and the command; ValueError as parse_srun_args."""
    args = parse_srun_args(argv)
    return args.passed, args.command


def special_io(value: str) -> bool:
    """An --output/--error/--input value that names no file: "none" (/dev/null), "all", or a task
    number (that task's stream only); Slurm's srun takes these as they are."""
    return value.lower() in ("none", "all") or value.isdigit()


def host_io_options(io_words: object) -> list[str]:
    """The daemon's per-step file options for Slurm's srun (--output=/abs, --open-mode=...), checked
    again here: only those options, and a file name only as an absolute path without '..'.
    ValueError otherwise."""
    if not isinstance(io_words, list):
        raise ValueError("srun: error: the bridge sent no valid file options for this step")
    for word in io_words:
        name, eq, value = str(word).partition("=")
        ok = eq and name in ("--output", "--error", "--input", "--open-mode")
        if ok and name == "--open-mode":
            ok = value in OPEN_MODES
        elif ok:
            ok = special_io(value) or (value.startswith("/") and "/../" not in value + "/")
        if not ok:
            raise ValueError(f"srun: error: the bridge sent an unusable file option for this step: {word}")
    return [str(w) for w in io_words]
