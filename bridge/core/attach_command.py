"""The command that starts a waiter on the slurmd hosts, and why a given one may not. Pure.

It runs as the job's user, in the user's environment and submit directory: whatever it names
relatively (a program on the PATH, a script beside the cwd) the user can plant, and Python without
-I reads PYTHONPATH & co. bridge.core.config validates `waiter.attach_command` with it; the doctor
checks the files it names (attach_command_files).
"""

from __future__ import annotations

import re
import shlex

DEFAULT_ATTACH_COMMAND = "/usr/bin/python3 -I -S /usr/libexec/slurm-k8s-bridge/waiter.py"
"""The waiter as the slurmds start it: the root-owned zipapp `slurm-k8s-bridge waiter-build` writes,
by absolute path, in isolated mode (-I: no PYTHON* variables, no user site, no script or cwd directory
on sys.path)."""
SHELL_SPECIAL = frozenset("$`;|&<>(){}*?[]~#!\\\n")
"""What the batch script's /bin/sh would interpret in a word job_submit.lua writes into it."""
_PYTHON = re.compile(r"^(python|pypy)[0-9.]*$")
# Programs whose business is to start another program, found on the PATH (the job's, i.e. the
# user's) unless named by absolute path: the waiter must not be started through them.
_PROGRAM_RUNNERS = frozenset({
    "env", "sh", "bash", "dash", "zsh", "ksh", "csh", "tcsh", "fish", "busybox", "nice", "nohup",
    "setsid", "stdbuf", "timeout", "ionice", "chrt", "taskset", "numactl", "xargs", "sudo", "su",
    "runuser", "doas", "exec", "command", "time", "flock", "unshare", "nsenter", "chroot", "strace",
})


def attach_command_problem(command: str) -> str | None:
    """Why `command` may not start the waiter, or None. It runs as the job's user, in the user's
    environment and submit directory: whatever it names relatively (a program on the PATH, a
    script beside the cwd) the user can plant, and Python without -I reads PYTHONPATH & co."""
    special = sorted(set(command) & SHELL_SPECIAL)
    if special:
        # job_submit.lua writes it into a /bin/sh script: `$HOME`, a glob or a `;` would be expanded
        # in the user's environment and directory.
        return f"{command!r} holds {''.join(special)!r}, which the batch script's shell would interpret"
    try:
        words = shlex.split(command)
    except ValueError as error:
        return f"{command!r} is not a valid command line ({error})"
    if not words or not words[0].startswith("/"):
        return (f"{command!r} does not start with an absolute path: the job's PATH is the user's to "
                f"shape. Use e.g. {DEFAULT_ATTACH_COMMAND!r}")
    program = words[0].rsplit("/", 1)[1]
    if program in _PROGRAM_RUNNERS:
        return (f"{command!r} starts {program}, which runs another program looked up on the user's "
                "PATH; name the interpreter itself by absolute path")
    if _PYTHON.match(program):
        isolated, target = _python_options(words[1:])
        if not isolated:
            return (f"{command!r} runs Python without -I: PYTHONPATH, the user site and the cwd would "
                    "decide what it imports. Add -I -S before the waiter's path")
        if target is not None and not target.startswith("/"):
            return f"{command!r}: the script {target!r} is not an absolute path (it would be the cwd's)"
    return None


def attach_command_files(command: str) -> list[str]:
    """The files a valid attach command runs: its program and, for Python, the script."""
    words = shlex.split(command)
    files = words[:1]
    if _PYTHON.match(words[0].rsplit("/", 1)[-1]):
        script = _python_options(words[1:])[1]
        files += [script] if script else []
    return files


def _python_options(args: list[str]) -> tuple[bool, str | None]:
    """(is -I among the interpreter's options, the script path if one follows them)."""
    isolated, rest = False, iter(args)
    for arg in rest:
        if arg in ("--", "-") or not arg.startswith("-"):
            return isolated, (None if arg in ("--", "-") else arg)
        if arg.startswith("--"):
            continue  # --version & co.: no short options inside
        for at, letter in enumerate(arg[1:], start=1):
            isolated = isolated or letter == "I"
            if letter in "cm":  # a program text or a module follows, not a script path
                return isolated, None
            if letter in "WX":  # the option's argument: the rest of this word, or the next one
                if at == len(arg) - 1:
                    next(rest, None)
                break
    return isolated, None
