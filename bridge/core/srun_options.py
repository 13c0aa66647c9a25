"""The srun options a step of a bridged job may use, and how srun reads its command line. The
waiter refuses a step with any other before it runs Slurm's srun (bridge/waiter/steps.py); the
daemon checks the same before it runs the step's command in the pods (bridge/manager/api.py).

Pure and standard library only: the waiter imports it at every job start (see waiter_protocol).
"""

from __future__ import annotations

# Layout, labels and exit handling only. Anything else (--prolog, --task-prolog, --bcast,
# --export, ...) would run or place something on the slurmd host, or has no meaning for pods; it
# is refused with srun's own wording.
SRUN_VALUE_OPTIONS = frozenset({
    "-N", "--nodes", "-n", "--ntasks", "--ntasks-per-node", "-c", "--cpus-per-task", "-w", "--nodelist",
    "-x", "--exclude", "-J", "--job-name", "-t", "--time", "--mem", "--mem-per-cpu", "--gres", "--gpus",
    "--gpus-per-node", "--gpus-per-task", "-m", "--distribution", "--mpi", "--cpu-bind", "--network",
})
SRUN_FLAG_OPTIONS = frozenset({
    "--overlap", "--exclusive", "-l", "--label", "-K", "--kill-on-bad-exit", "-u", "--unbuffered",
    "-Q", "--quiet", "-v", "--verbose", "-X", "--disable-status", "--whole",
    "--external-launcher",  # what mpirun (Open MPI, MPICH hydra) adds to start its daemons
})


def split_srun_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """srun's own options and the command, as srun reads them; ValueError for an option a
    bridged step cannot take, or no command."""
    options: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            i += 1
            break
        if not word.startswith("-") or word == "-":
            break
        name, eq, value = word.partition("=")
        attached = len(name) > 2 and not name.startswith("--") and name[:2] in SRUN_VALUE_OPTIONS  # -n4
        if name == "--mpi":
            # slurmstepd's PMI server lives on the slurmd host, out of the pods' reach.
            mpi = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            if mpi != "none":
                raise ValueError(f"srun: error: --mpi={mpi} is not available in a job that runs in "
                                 "Kubernetes: start MPI programs with mpirun (it starts its daemons by srun)")
        if (name in SRUN_FLAG_OPTIONS and not eq) or (name in SRUN_VALUE_OPTIONS and eq) or attached:
            options.append(word)
        elif name in SRUN_VALUE_OPTIONS and i + 1 < len(argv):
            options += [word, argv[i + 1]]
            i += 1
        else:
            raise ValueError(f"srun: error: option {word} is not available in a job that runs in Kubernetes")
        i += 1
    command = argv[i:]
    if not command:
        raise ValueError("srun: fatal: No command given to execute.")
    return options, command
