"""The command that starts a waiter on the slurmd hosts, and why a given one may not. Pure.

It runs as the job's user, in the user's environment and submit directory: whatever it names
relatively (a program on the PATH, a script beside the cwd) the user can plant. bridge.core.config
validates `waiter.attach_command` with it; the doctor checks the program it names
(attach_command_files).
"""

from __future__ import annotations

import re
import shlex

DEFAULT_ATTACH_COMMAND = "/usr/libexec/slurm-k8s-bridge/waiter"
"""The waiter as the slurmds start it: the compiled, static program (agent/cmd/waiter) that
deploy/slurm/install-waiter.sh installs root-owned, by absolute path."""
INSTALL_WAITER = f"deploy/slurm/install-waiter.sh {DEFAULT_ATTACH_COMMAND}"
"""How to install it (as root, from the bridge's source)."""
SHELL_SPECIAL = frozenset("$`;|&<>(){}*?[]~#!\\\n")
"""What the batch script's /bin/sh would interpret in a word job_submit.lua writes into it."""
_PYTHON = re.compile(r"^(python|pypy)[0-9.]*$")
_WAITER_OPTIONS = frozenset({"--api", "--ca"})
"""What the waiter reads before its batch script (agent/internal/waiter/cli.go), each with a value."""
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
    file beside the cwd) the user can plant."""
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
                "PATH; name the waiter itself by absolute path")
    if _PYTHON.match(program) or program == "slurm-k8s-bridge":
        # The Python waiter (bridge/waiter, `slurm-k8s-bridge attach`) is gone.
        return (f"{command!r} starts a Python waiter, which no longer exists: the waiter is the compiled "
                f"{DEFAULT_ATTACH_COMMAND} (install it with {INSTALL_WAITER})")
    options = words[1:]
    if len(options) % 2 or any(option not in _WAITER_OPTIONS for option in options[::2]):
        # The waiter takes only these, each followed by its value, before the batch script that
        # job_submit.lua appends: anything else (`--ca=FILE` too) it would run as the script.
        return (f"{command!r} gives the waiter {' '.join(options)!r}: after the program, only "
                "`--api URL` and `--ca FILE` are understood")
    ca_file = _ca_file(words)
    if ca_file is not None and not ca_file.startswith("/"):
        # The waiter reads it in the job's working directory, where the user may put their own CA
        # and so have the waiter trust a daemon of theirs.
        return (f"{command!r} names its --ca file {ca_file!r} relatively: the waiter would read it in "
                "the job's working directory, which is the user's; name it by absolute path")
    return None


def attach_command_files(command: str) -> list[str]:
    """The files a valid attach command runs: its program."""
    return shlex.split(command)[:1]


def attach_command_ca_file(command: str) -> str | None:
    """The CA file a valid attach command's waiter trusts the daemon's certificate by (`--ca`)."""
    return _ca_file(shlex.split(command))


def _ca_file(words: list[str]) -> str | None:
    # As the waiter reads its options (agent/internal/waiter/cli.go): pairs before anything else,
    # the last one of a kind counting.
    ca_file, at = None, 1
    while at + 1 < len(words) and words[at] in ("--api", "--ca"):
        if words[at] == "--ca":
            ca_file = words[at + 1]
        at += 2
    return ca_file
