"""What the daemon makes of a step request's srun options that the bridge honours itself
(core/srun_options.py reads the command line): the per-step files (--output, --error, --input,
--open-mode) as paths on the slurmd host, the task's working directory (--chdir) and environment
(--export), and the config file of --multi-prog. Pure.

The per-step files are opened by slurmstepd on the slurmd host, as the job's user, as the batch
job's own -o/-e files are: a path the pods see through one of the partition's volumes is the same
file there (its host_path), so the file lands where the user named it. A path outside every volume
would be a file of the slurmd host, not of the pods: it is refused with that reason.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence

from bridge.core.job_environment import task_gpu_environment
from bridge.core.srun_options import NOT_HERE, SrunArgs, special_io
from bridge.core.volume_paths import through_volumes

Volumes = Sequence[tuple[str, str]]
"""(mount_path in the pods, host_path) of each of the partition's volumes."""

TASK_CWD = "SLURM_K8S_BRIDGE_TASK_CWD"
TASK_EXACT_ENV = "SLURM_K8S_BRIDGE_TASK_EXACT_ENV"
"""Set: the task's environment is exactly the one given (--export without ALL), not the container's
with it on top."""
TASK_MULTI_PROG = "SLURM_K8S_BRIDGE_TASK_MULTI_PROG"
"""Set: the command is a --multi-prog config file; the agent runs the task's own line of it."""
TASK_STDIN_SIZE = "SLURM_K8S_BRIDGE_TASK_STDIN_SIZE"
"""The task's stdin (--input=FILE) follows on the exec's stdin: this many bytes."""
TASK_STDERR_TO_STDOUT = "SLURM_K8S_BRIDGE_TASK_STDERR_TO_STDOUT"
"""Set: the task's stderr is its stdout (one per-task file for both), so their order is the writes'."""
TASK_TTY_SIZE = "SLURM_K8S_BRIDGE_TASK_TTY_SIZE"
"""srun --pty's window size, "ROWS COLS": the agent gives the task's terminal that size before the
task starts (the exec's resize message may come later)."""
TASK_UNSET = "SLURM_K8S_BRIDGE_TASK_UNSET"
"""Comma-separated names the agent removes from the task's environment (the container's included):
what slurmstepd unsets for a task, such as the GPU ordinals of a step without GPUs."""


def per_task(pattern: str) -> bool:
    """A file pattern with a task's or node's part (%t, %n, %N, with an optional width: %3t): each
    task's slurmstepd opens its own file. Otherwise Slurm's srun opens the one file itself and
    writes what the tasks send it (a relative name is then relative to srun's directory)."""
    i = 0
    while i < len(pattern) - 1:
        if pattern[i] == "%":
            j = i + 1
            while j < len(pattern) and pattern[j].isdigit():
                j += 1
            if j < len(pattern) and pattern[j] in "tnN":
                return True
            i = j + 1 if j < len(pattern) and pattern[j] == "%" else j
        else:
            i += 1
    return False


def stderr_to_stdout(args: SrunArgs) -> bool:
    """The task's stdout and stderr are one file its slurmstepd opens (--output with a per-task
    pattern and no other --error): natively both fds are that file, so the lines keep their order."""
    output = args.io.get("output")
    error = args.io.get("error", output)
    return output is not None and error == output and not special_io(output) and per_task(output)


def absolute(path: str, cwd: str) -> str:
    """`path` as a normalised absolute path, relative ones taken from `cwd` (as srun does)."""
    return posixpath.normpath(posixpath.join(cwd or "/", path))


def task_cwd(args: SrunArgs, cwd: str) -> str:
    """The task's working directory: --chdir (relative to srun's) or srun's own."""
    return absolute(args.chdir, cwd) if args.chdir else cwd


def on_host(path: str, volumes: Volumes) -> str | None:
    """The slurmd host's path of the pods' `path` (absolute, normalised), through the volume whose
    mount_path holds it most closely; None outside every volume."""
    return through_volumes(path, volumes)


def with_job_name(pattern: str, job_name: str | None) -> str:
    """`pattern` with its %x (the job's name, which Slurm's srun would put in) filled in here, so
    that the path is checked as it will be opened; a % of the name stays a plain %. ValueError for
    a %x with no name known."""
    out, i = [], 0
    while i < len(pattern):
        if pattern[i] != "%":
            out.append(pattern[i])
            i += 1
            continue
        j = i + 1
        while j < len(pattern) and pattern[j].isdigit():
            j += 1
        if j < len(pattern) and pattern[j] == "x":
            if job_name is None:
                raise ValueError("srun: error: %x in a file name needs the job's name (SLURM_JOB_NAME)")
            out.append(job_name.replace("%", "%%"))
        else:
            out.append(pattern[i:j + 1])
        i = j + 1
    return "".join(out)


def host_io_options(args: SrunArgs, cwd: str, volumes: Volumes, job_name: str | None = None) -> list[str]:
    """Slurm's srun options for the step's files, with each file as the slurmd host sees it (%x,
    the job's name, filled in). ValueError (the reason, in srun's words) for a file outside the
    partition's volumes."""
    options: list[str] = []
    for name in ("output", "error", "input"):
        value = args.io.get(name)
        if value is None:
            continue
        if special_io(value):
            options.append(f"--{name}={value}")
            continue
        # A job's name may hold a '/' or '..': the path is checked with it in its place.
        value = with_job_name(value, job_name)
        # slurmstepd opens a per-task file in the task's directory (--chdir); srun its own in its own.
        path = absolute(value, task_cwd(args, cwd) if per_task(value) else cwd)
        mapped = on_host(path, volumes)
        if mapped is None:
            shared = ", ".join(sorted(m for m, _ in volumes)) or "none"
            raise ValueError(
                f"srun: error: option --{name}={value} {NOT_HERE}: {path} is not on a volume the pods share "
                f"with the slurmd host (shared: {shared}); name a file under one of them")
        options.append(f"--{name}={mapped}")
    if args.open_mode:
        options.append(f"--open-mode={args.open_mode}")
    return options


def task_environment(
    args: SrunArgs, step_env: Mapping[str, str], task_env: Mapping[str, str],
) -> dict[str, str]:
    """The task's environment as srun's --export makes it, from srun's environment in the script
    (`step_env`) and the SLURM_* slurmstepd set for the task (`task_env`, which always win). With ALL
    (the default) it goes on top of the container's; without, it is the whole of it (TASK_EXACT_ENV)."""
    words = [w for w in args.export.split(",") if w] if args.export else ["ALL"]
    upper = [w.upper() for w in words]
    if "ALL" in upper:
        env = dict(step_env)
    else:
        env = {k: v for k, v in step_env.items() if k.startswith("SLURM")}
        # No PATH then either: natively a command must be named by its path (execve fails).
        env[TASK_EXACT_ENV] = "1"
    for word, up in zip(words, upper, strict=True):
        if up in ("ALL", "NONE"):
            continue
        name, eq, value = word.partition("=")
        if eq:
            env[name] = value
        elif name in step_env:
            env[name] = step_env[name]
    own = dict(task_env)
    if not any(word.startswith("--job-name=") for word in args.passed) and "SLURM_JOB_NAME" in env:
        # The waiter names the step after its command for Slurm's srun, as native srun does (sacct's
        # step name); natively the tasks still get srun's SLURM_JOB_NAME unless the user gave -J.
        own.pop("SLURM_JOB_NAME", None)
    env.update(own)
    return env


def set_task_gpus(env: dict[str, str], step_gpus: str | None, pod_gpus: tuple[int, ...] | None) -> None:
    """Give the task in `env` the GPUs slurmstepd gave it (`step_gpus`, its SLURM_STEP_GPUS) as
    ordinals of the pod's (`pod_gpus`; None while the allocation is not known: the pod's own stay)."""
    if pod_gpus is None:
        return
    settings, unset = task_gpu_environment(step_gpus, pod_gpus)
    env.update(settings)
    for name in unset:
        env.pop(name, None)
    if unset:
        env[TASK_UNSET] = ",".join(unset)
