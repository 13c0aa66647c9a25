"""Slurm's own commands asked for from inside a bridged job's pod (`scontrol`, `squeue`, `sbatch`,
`scancel`, `sacct`, `sinfo`, `sstat`; srun's help and version): what may be run, and the exact argv
the waiter gives Slurm's binary.

The waiter runs the real binary on the slurmd host, as the job's user, so anything that would make
it read a file or run a program there is refused, each with its reason. Arguments are parsed as
the binaries' getopt_long parses them (options anywhere, clustered short options, unique prefixes
of long options) and given back canonical: every option by its full name, so the binary sees
exactly what was checked. An option missing from a table is refused, never passed through.

Shared by the daemon (controller.commands checks before anything reaches the waiter) and the
waiter (which checks again before it runs anything). Pure and standard library only.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

NO, ARG, OPT = 0, 1, 2
"""An option takes no value, a value (`--x=v` or `--x v`, `-xv` or `-x v`), or one only as `--x=v`."""

COMMANDS = ("scontrol", "squeue", "sbatch", "scancel", "sacct", "sinfo", "sstat", "srun")
"""srun only for its help, usage, version and --mpi=list (the pod's srun asks so: its steps come
another way)."""
BINARY_DIRS = ("/usr/bin", "/usr/local/bin", "/opt/slurm/bin")
"""Where the waiter looks for Slurm's binaries, by absolute path (never the job's PATH)."""
MAX_ARGS = 256
MAX_ARGV_BYTES = 64 * 1024
MAX_SCRIPT_BYTES = 512 * 1024
"""A script sbatch gets from the pod (Slurm's own default limit is 4 MB): base64 twice over (in
the JSON, then the frame), with the environment, it must fit one log line the daemon reads whole."""
MAX_REQUEST_BYTES = (1 << 20) - 4096
"""A whole request as framed in the pod's log: below the 1 MiB at which the daemon's log reader
(clients/kube/lines.py MAX_LINE) hands a line out in pieces, less the line's timestamp. The agent
refuses a bigger one itself (agent/commands.go maxFrameData), so that none is ever cut."""

_HELP = {"help": NO, "usage": NO, "version": NO}

_SHORT: dict[str, dict[str, int]] = {
    "squeue": {"A": ARG, "a": NO, "h": NO, "i": ARG, "j": ARG, "l": NO, "L": ARG, "M": ARG, "n": ARG,
               "o": ARG, "O": ARG, "p": ARG, "q": ARG, "R": ARG, "r": NO, "s": ARG, "S": ARG, "t": ARG,
               "u": ARG, "v": NO, "V": NO, "w": ARG},
    "sinfo": {"a": NO, "d": NO, "e": NO, "F": NO, "h": NO, "i": ARG, "l": NO, "M": ARG, "n": ARG,
              "N": NO, "o": ARG, "O": ARG, "p": ARG, "r": NO, "R": NO, "s": NO, "S": ARG, "t": ARG,
              "T": NO, "v": NO, "V": NO},
    "sacct": {"a": NO, "A": ARG, "b": NO, "B": NO, "c": NO, "D": NO, "e": NO, "E": ARG, "f": ARG,
              "g": ARG, "h": NO, "i": ARG, "I": ARG, "j": ARG, "k": ARG, "K": ARG, "l": NO, "L": NO,
              "M": ARG, "n": NO, "N": ARG, "o": ARG, "p": NO, "P": NO, "q": ARG, "r": ARG, "R": ARG,
              "s": ARG, "S": ARG, "T": NO, "u": ARG, "v": NO, "V": NO, "W": ARG, "x": ARG, "X": NO},
    "scancel": {"A": ARG, "b": NO, "c": NO, "f": NO, "H": NO, "i": NO, "M": ARG, "n": ARG, "p": ARG,
                "Q": NO, "q": ARG, "R": ARG, "s": ARG, "t": ARG, "u": ARG, "V": NO, "v": NO, "w": ARG},
    "scontrol": {"a": NO, "d": NO, "F": NO, "h": NO, "M": ARG, "o": NO, "Q": NO, "u": ARG, "v": NO,
                 "V": NO},
    "sstat": {"a": NO, "e": NO, "h": NO, "i": NO, "j": ARG, "n": NO, "o": ARG, "p": NO, "P": NO, "v": NO,
              "V": NO},
    "srun": {"h": NO, "V": NO},
    "sbatch": {"a": ARG, "A": ARG, "b": ARG, "B": ARG, "c": ARG, "C": ARG, "d": ARG, "D": ARG, "e": ARG,
               "F": ARG, "G": ARG, "H": NO, "h": NO, "i": ARG, "J": ARG, "k": NO, "L": ARG, "M": ARG,
               "m": ARG, "n": ARG, "N": ARG, "o": ARG, "O": NO, "p": ARG, "q": ARG, "Q": NO, "s": NO,
               "S": ARG, "t": ARG, "V": NO, "v": NO, "W": NO, "w": ARG, "x": ARG},
}
"""Short options, letter -> arity, as each binary's getopt string has them."""

_LONG: dict[str, dict[str, int]] = {
    "squeue": {"account": ARG, "all": NO, "federation": NO, "noheader": NO, "hide": NO, "iterate": ARG,
               "job": ARG, "jobs": ARG, "json": OPT, "local": NO, "long": NO, "licenses": ARG,
               "clusters": ARG, "cluster": ARG, "name": ARG, "noconvert": NO, "format": ARG,
               "Format": ARG, "only-job-state": NO, "partition": ARG, "qos": ARG, "reservation": ARG,
               "array": NO, "array-unique": NO, "running-over": ARG, "running-under": ARG,
               "sibling": NO, "step": ARG, "steps": ARG, "sort": ARG, "start": NO, "states": ARG,
               "state": ARG, "user": ARG, "users": ARG, "me": NO, "verbose": NO, "nodelist": ARG,
               "nodes": ARG, "yaml": OPT, "helpformat": NO, "helpFormat": NO, "helpstate": NO,
               **_HELP},
    "sinfo": {"all": NO, "dead": NO, "exact": NO, "federation": NO, "future": NO, "noheader": NO,
              "hide": NO, "iterate": ARG, "json": OPT, "local": NO, "long": NO, "clusters": ARG,
              "cluster": ARG, "nodes": ARG, "noconvert": NO, "Node": NO, "format": ARG, "Format": ARG,
              "partition": ARG, "responding": NO, "list-reasons": NO, "summarize": NO, "sort": ARG,
              "states": ARG, "reservation": NO, "verbose": NO, "yaml": OPT, "helpformat": NO,
              "helpFormat": NO, "helpstate": NO, **_HELP},
    "sacct": {"allusers": NO, "accounts": ARG, "array": NO, "brief": NO, "batch-script": NO,
              "completion": NO, "delimiter": ARG, "duplicates": NO, "helpformat": NO, "endtime": ARG,
              "env-vars": NO, "federation": NO, "expand-pattern": NO, "file": ARG, "gid": ARG,
              "group": ARG, "helpreason": NO, "helpstate": NO, "nnodes": ARG, "ncpus": ARG,
              "jobs": ARG, "json": OPT, "timelimit-min": ARG, "timelimit-max": ARG, "local": NO,
              "long": NO, "allclusters": NO, "clusters": ARG, "noheader": NO, "noconvert": NO,
              "nodelist": ARG, "name": ARG, "format": ARG, "parsable": NO, "parsable2": NO, "qos": ARG,
              "partition": ARG, "reason": ARG, "state": ARG, "starttime": ARG, "truncate": NO,
              "uid": ARG, "user": ARG, "units": ARG, "verbose": NO, "wckeys": ARG, "whole-hetjob": OPT,
              "associations": ARG, "allocations": NO, "yaml": OPT, "me": NO, **_HELP},
    "scancel": {"account": ARG, "admin-comment": ARG, "batch": NO, "ctld": NO, "cron": NO, "full": NO,
                "hurry": NO, "interactive": NO, "clusters": ARG, "cluster": ARG, "name": ARG,
                "jobname": ARG, "partition": ARG, "quiet": NO, "qos": ARG, "reservation": ARG,
                "sibling": ARG, "signal": ARG, "state": ARG, "user": ARG, "me": NO, "verbose": NO,
                "nodelist": ARG, "wckey": ARG, **_HELP},
    "scontrol": {"all": NO, "details": NO, "federation": NO, "future": NO, "hide": NO, "json": OPT,
                 "local": NO, "cluster": ARG, "clusters": ARG, "oneliner": NO, "quiet": NO,
                 "sibling": NO, "uid": ARG, "verbose": NO, "yaml": OPT, **_HELP},
    "sstat": {"autocomplete": ARG, "allsteps": NO, "helpformat": NO, "jobs": ARG, "noheader": NO,
              "fields": ARG, "format": ARG, "noconvert": NO, "pidformat": NO, "parsable": NO,
              "parsable2": NO, "verbose": NO, **_HELP},
    "srun": {"mpi": ARG, **_HELP},
    "sbatch": {"array": ARG, "account": ARG, "bb": ARG, "bbf": ARG, "begin": ARG, "comment": ARG,
               "cpu-freq": ARG, "cpus-per-task": ARG, "dependency": ARG, "deadline": ARG,
               "delay-boot": ARG, "chdir": ARG, "error": ARG, "export": OPT, "export-file": ARG,
               "get-user-env": OPT, "gid": ARG, "gres": ARG, "gres-flags": ARG, "hold": NO,
               "ignore-pbs": NO, "input": ARG, "job-name": ARG, "no-kill": OPT, "licenses": ARG,
               "clusters": ARG, "cluster": ARG, "distribution": ARG, "mail-type": ARG,
               "mail-user": ARG, "mcs-label": ARG, "ntasks": ARG, "nice": OPT, "no-requeue": NO,
               "ntasks-per-node": ARG, "nodes": ARG, "oom-kill-step": OPT, "output": ARG,
               "overcommit": NO, "partition": ARG, "parsable": NO, "power": ARG, "priority": ARG,
               "profile": ARG, "propagate": OPT, "qos": ARG, "quiet": NO, "reboot": NO,
               "requeue": OPT, "oversubscribe": NO, "core-spec": ARG, "signal": ARG,
               "spread-job": NO, "spread-segments": NO, "switches": ARG, "thread-spec": ARG,
               "time": ARG, "time-min": ARG, "tres-bind": ARG, "tres-per-task": ARG, "uid": ARG,
               "use-min-nodes": NO, "verbose": NO, "wait": NO, "wckey": ARG, "wrap": ARG,
               "cluster-constraint": ARG, "contiguous": NO, "constraint": ARG, "nodefile": ARG,
               "mem": ARG, "mincpus": ARG, "reservation": ARG, "tmp": ARG, "nodelist": ARG,
               "exclude": ARG, "container": ARG, "container-id": ARG, "exclusive": OPT,
               "mem-per-cpu": ARG, "resv-ports": OPT, "sockets-per-node": ARG,
               "cores-per-socket": ARG, "threads-per-core": ARG, "extra-node-info": ARG,
               "ntasks-per-core": ARG, "ntasks-per-socket": ARG, "cpus-per-gpu": ARG, "gpus": ARG,
               "gpu-bind": ARG, "gpu-freq": ARG, "gpus-per-node": ARG, "gpus-per-socket": ARG,
               "gpus-per-task": ARG, "mem-per-gpu": ARG, "extra": ARG, "test-only": NO,
               "kill-on-invalid-dep": ARG, "acctg-freq": ARG, "hint": ARG, "mem-bind": ARG,
               "network": ARG, "prefer": ARG, "segment": ARG, "ntasks-per-gpu": ARG, "batch": ARG,
               "open-mode": ARG, "cpus-per-gres": ARG, **_HELP},
}
"""Long options, name -> arity: every one each binary knows (a unique prefix is resolved against
all of them, as getopt_long does), the refused ones included."""

_SHORT_LONG = {"sbatch": {"F": "nodefile"}, "sacct": {"f": "file"}}
"""Short options that are the same as a refused long one."""

ON_HOST = "it would read a file on the slurmd host, where nothing of a bridged job's user is"
REFUSED: dict[str, dict[str, str]] = {
    "sbatch": {
        "export-file": "the job's environment in the pod is exported already (choose with --export)",
        "get-user-env": ("it runs the user's login shell (su -) on the host that starts the job; "
                         "a bridged job's pod gets the exported variables and the image's own"),
        "bbf": f"{ON_HOST}; give the burst buffer specification with --bb",
        "nodefile": f"{ON_HOST}; name the nodes with --nodelist",
    },
    "sacct": {"file": ON_HOST},
}
"""Options refused, with the reason the user reads."""

SCONTROL_VERBS = frozenset({
    "show", "hold", "holdu", "uhold", "release", "requeue", "requeuehold", "suspend", "resume",
    "update", "notify", "top", "ping", "version", "help", "errnumstr", "wait_job",
})
"""scontrol commands that only ask slurmctld, which applies its own permissions to the user."""
SCONTROL_HOST_VERBS = frozenset({"listpids", "listjobs", "liststeps", "pidinfo", "getent", "write"})
"""scontrol commands about (or writing files on) the host scontrol runs on: the slurmd host here."""


_INFO_ONLY = {c: frozenset({"help", "h", "usage", "version", "V"}) for c in ("sbatch", "scontrol", "srun")}
"""Options with which sbatch, scontrol and srun only print their help or version."""


_PLUGIN_NAME = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,+_-")


class Refused(ValueError):
    """The request is not run; str() is the line for the command's stderr."""


class Prepared:
    """What the waiter runs: Slurm's binary `command` with `argv` (after the binary's path), the
    script text for its stdin (sbatch), and the variables sbatch exports to the job."""

    def __init__(self, command: str, argv: list[str], stdin: bytes | None,
                 export: dict[str, str] | None) -> None:
        self.command, self.argv, self.stdin, self.export = command, argv, stdin, export


def parse_request(data: str) -> dict[str, Any]:
    """The agent's request as framed in the pod's log (base64 of its JSON): {key, command, argv,
    cwd, stdin, files, env}, decoded and typed; ValueError when it is not one."""
    import binascii
    import json

    try:
        raw = json.loads(binascii.a2b_base64(data.encode("ascii")))
        files = {str(k): binascii.a2b_base64(str(v).encode("ascii"))
                 for k, v in (raw.get("files") or {}).items()}
        return {
            "key": str(int(raw["key"])),
            "command": str(raw["command"]),
            "argv": [str(a) for a in raw.get("argv") or []],
            "cwd": str(raw.get("cwd") or ""),
            "stdin": binascii.a2b_base64(str(raw.get("stdin") or "").encode("ascii")),
            "files": files,
            "env": {str(k): str(v) for k, v in (raw.get("env") or {}).items()},
        }
    except (ValueError, KeyError, TypeError, AttributeError, binascii.Error) as error:
        raise ValueError(f"not a command request: {error!r}") from None


def prepare_request(request: dict[str, Any]) -> Prepared:
    """What the waiter runs for a request parse_request read, or Refused."""
    return prepare(request["command"], request["argv"], request["cwd"], request["files"], request["stdin"],
                   request["env"])


def _long_name(command: str, given: str) -> str:
    table = _LONG[command]
    if given in table:
        return given
    matches = [name for name in table if name.startswith(given)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise Refused(f"{command}: option '--{given}' is ambiguous ({', '.join(sorted(matches))})")
    raise Refused(f"{command}: option '--{given}' is not allowed inside a job that runs in Kubernetes")


def parse(command: str, argv: list[str]) -> tuple[list[tuple[str, str | None]], list[str]]:
    """(options as (long name or short letter, value), positional arguments), as getopt_long reads
    them; Refused for an unknown or refused option, or a missing value."""
    options: list[tuple[str, str | None]] = []
    positionals: list[str] = []
    shorts, longs = _SHORT[command], _LONG[command]
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":
            positionals.extend(argv[i:])
            break
        if arg.startswith("--"):
            given, eq, value = arg[2:].partition("=")
            name = _long_name(command, given)
            arity = longs[name]
            if arity == NO and eq:
                raise Refused(f"{command}: option '--{name}' doesn't allow an argument")
            if arity == ARG and not eq:
                if i >= len(argv):
                    raise Refused(f"{command}: option '--{name}' requires an argument")
                value, eq = argv[i], "="
                i += 1
            options.append((name, value if eq else None))
        elif arg.startswith("-") and arg != "-":
            j = 1
            while j < len(arg):
                letter = arg[j]
                j += 1
                if letter not in shorts:
                    raise Refused(f"{command}: option '-{letter}' is not allowed inside a job that runs "
                                  "in Kubernetes")
                if shorts[letter] == NO:
                    options.append((letter, None))
                    continue
                value = arg[j:]
                if not value:
                    if i >= len(argv):
                        raise Refused(f"{command}: option requires an argument -- '{letter}'")
                    value = argv[i]
                    i += 1
                options.append((letter, value))
                break
        else:
            positionals.append(arg)
    for name, plugin in options:
        if name in ("json", "yaml") and plugin is not None and not set(plugin) <= _PLUGIN_NAME:
            # It names a data_parser plugin, which the binary loads: a name, never a path.
            raise Refused(f"{command}: --{name}={plugin!r}: not a data_parser plugin name")
        long_name = _SHORT_LONG.get(command, {}).get(name, name)
        reason = REFUSED.get(command, {}).get(long_name)
        if reason is not None:
            shown = f"--{long_name}" if len(name) > 1 else f"-{name}"
            raise Refused(f"{command}: option {shown} is not allowed inside a job that runs in Kubernetes: "
                          f"{reason}")
    return options, positionals


def canonical(options: list[tuple[str, str | None]]) -> list[str]:
    """The options as the binary is given them: full long names, `-xVALUE` for short ones."""
    out = []
    for name, value in options:
        if len(name) == 1:
            out.append(f"-{name}" if value is None else f"-{name}{value}")
        else:
            out.append(f"--{name}" if value is None else f"--{name}={value}")
    return out


def _check_sizes(argv: list[str]) -> None:
    if len(argv) > MAX_ARGS:
        raise Refused(f"more than {MAX_ARGS} arguments")
    if sum(len(a.encode("utf-8", "surrogateescape")) + 1 for a in argv) > MAX_ARGV_BYTES:
        raise Refused(f"the arguments exceed {MAX_ARGV_BYTES // 1024} KiB")
    if any("\0" in a for a in argv):
        raise Refused("an argument holds a NUL byte")


def prepare(command: str, argv: list[str], cwd: str, files: Mapping[str, bytes] | None = None,
            stdin: bytes | None = None, env: Mapping[str, str] | None = None) -> Prepared:
    """The run of `command argv` asked for from the pod (in `cwd` there; `files`: the contents of
    arguments that name files in the pod; `stdin`: what the pod's command read on its stdin;
    `env`: the pod's environment, for sbatch), or Refused with the reason."""
    if command not in COMMANDS:
        raise Refused(f"{command!r} is not one of the Slurm commands available in the pod "
                      f"({', '.join(COMMANDS)})")
    _check_sizes(argv)
    options, positionals = parse(command, argv)
    if command == "srun" and len(options) != 1:
        raise Refused("srun: error: only srun's help, usage, version and --mpi=list are asked this way")
    if {name for name, _ in options} & _INFO_ONLY.get(command, frozenset()):
        return Prepared(command, canonical(options), None, None)  # needs no script, nor command
    if command == "srun":
        if options == [("mpi", "list")]:
            return Prepared(command, ["--mpi=list"], None, None)  # the MPI plugins Slurm has
        raise Refused("srun: error: only srun's help, usage, version and --mpi=list are asked this way")
    if command == "scontrol":
        return Prepared(command, canonical(options) + _scontrol_words(positionals), None, None)
    if command == "sbatch":
        return _sbatch(options, positionals, cwd, files or {}, stdin, env or {})
    if command in ("squeue", "sinfo") and positionals:
        raise Refused(f"{command}: error: Unrecognized option: {positionals[0]}")
    tail = ["--", *positionals] if positionals else []
    return Prepared(command, canonical(options) + tail, None, None)


def _scontrol_words(words: list[str]) -> list[str]:
    if not words:
        raise Refused("scontrol: give a command (interactive scontrol is not available inside a job "
                      "that runs in Kubernetes)")
    verb = words[0].lower()
    if verb in SCONTROL_HOST_VERBS:
        raise Refused(f"scontrol {verb} is not available inside a job that runs in Kubernetes: it acts on "
                      "the host scontrol runs on, the slurmd host, not on the job's pods")
    if verb not in SCONTROL_VERBS:
        raise Refused(f"scontrol {verb} is not available inside a job that runs in Kubernetes (allowed: "
                      f"{', '.join(sorted(SCONTROL_VERBS))})")
    return ["--", verb, *words[1:]]


def _sbatch(options: list[tuple[str, str | None]], positionals: list[str], cwd: str,
            files: Mapping[str, bytes], stdin: bytes | None, env: Mapping[str, str]) -> Prepared:
    wrap = any(name == "wrap" for name, _ in options)
    head = []
    # sbatch runs in / on the slurmd host: the job starts where the pod's sbatch was called.
    if cwd.startswith("/"):
        head.append(f"--chdir={cwd}")
    options = [(n, _absolute(v, cwd) if n in ("chdir", "D") and v is not None else v) for n, v in options]
    if positionals and positionals[0] == ":":
        raise Refused("sbatch: heterogeneous jobs (':') are not available inside a job that runs in "
                      "Kubernetes")
    if wrap:
        if positionals:
            raise Refused("sbatch: error: script arguments not permitted with --wrap option")
        script = None
        tail: list[str] = []
    elif positionals:
        path = positionals[0]
        script = files.get(path)
        if script is None:
            raise Refused(f"sbatch: error: Unable to open file {path}")
        head.append(f"--job-name={path.rsplit('/', 1)[-1]}")  # the user's -J, later, wins
        # The script's text comes on stdin; a path the waiter chose, never the user's, names it.
        tail = ["/dev/stdin", *positionals[1:]] if len(positionals) > 1 else []
    else:
        script = stdin or b""
        tail = []
    if script is not None and len(script) > MAX_SCRIPT_BYTES:
        raise Refused(f"sbatch: the script exceeds {MAX_SCRIPT_BYTES // 1024} KiB")
    return Prepared("sbatch", head + canonical(options) + tail, script, _exported(options, env))


def _absolute(path: str, cwd: str) -> str:
    return path if path.startswith("/") or not cwd.startswith("/") else f"{cwd.rstrip('/')}/{path}"


def _exported(options: list[tuple[str, str | None]], env: Mapping[str, str]) -> dict[str, str]:
    """The pod's variables sbatch hands the job, as its --export asks (ALL when not given; NONE:
    none; a list: those names; NAME=value items of the list sbatch sets itself)."""
    value = next((v for n, v in reversed(options) if n == "export"), None)
    if value is None:
        return dict(env)
    items = [item for item in value.split(",") if item]
    if any(item.upper() == "ALL" for item in items):
        return dict(env)
    names = {item for item in items if "=" not in item and item.upper() != "NONE"}
    return {k: v for k, v in env.items() if k in names}


def export_file_bytes(export: Mapping[str, str]) -> bytes:
    """sbatch --export-file's content: NAME=value items, each ended by a NUL."""
    return b"".join(f"{k}={v}".encode("utf-8", "surrogateescape") + b"\0"
                    for k, v in export.items() if k and "=" not in k and "\0" not in k + v)
