"""The user-step proxy (`waiter step -- ARGV...`): what a task of a step the user started in a
bridged job becomes (srun --jobid N --overlap, the srun of an salloc or of a bare srun's
allocation). The SPANK guard execs it in the task in place of the user's program, with the
environment held as for the waiter; it has the daemon run ARGV in the job's pod on this node,
as the user, in the step's directory and with the step's environment, streams the task's output
back for srun to gather, passes on the signals slurmstepd sends the task, and ends as the task
ended. The daemon's side: the user-step endpoints (bridge/manager/user_steps_api.py).

The user's program never runs here: only its argv travels, as data."""

from __future__ import annotations

import os

from bridge.waiter.task import end_as_the_task, proxy_task, start_signal_passing
from bridge.waiter.terminal import run_terminal_task


def run_user_step(
    api_url: str, ca_file: str | None, argv: list[str], environment: dict[str, str], work_dir: str,
    early: list[int] | None = None,
) -> int:
    """Run this task's `argv` in the pod of this node; the task's exit code. `environment` is the
    task's as the user exported it (held variables back under their names), `work_dir` the
    step's directory (slurmstepd's chdir)."""
    # What slurmstepd set for this task after the guard held the environment (SLURMD_NODENAME,
    # SLURM_PROCID, ...) is here as it is; job_environment keeps only SLURM_* of it.
    environment = {**environment, **{k: v for k, v in os.environ.items()
                                     if k.startswith("SLURM") and not k.startswith("SLURM_K8S_BRIDGE")}}
    job_id = int(environment["SLURM_JOB_ID"])
    node = environment.get("SLURMD_NODENAME", "")
    step = environment.get("SLURM_STEP_ID", "")
    procid = environment.get("SLURM_PROCID", "0")
    body: dict[str, object] = {
        "step": step, "node": node, "argv": argv, "cwd": work_dir,
        "env": {k: v for k, v in environment.items() if not k.startswith("SLURM_K8S_BRIDGE")},
        "tty": os.isatty(0) and os.isatty(1),
    }
    signal_fields: dict[str, object] = {"step": step, "procid": procid, "node": node}
    signals = (f"/v1/jobs/{job_id}/user-task-signal", signal_fields)
    if body["tty"]:
        # srun --pty: slurmstepd gave this task a terminal; the task in the pod gets one too.
        url, pass_on = start_signal_passing(api_url, ca_file, job_id, signals, early)
        return run_terminal_task(url, ca_file, job_id, f"/v1/jobs/{job_id}/user-task-tty", body,
                                 pass_on, end_as_the_task)
    return proxy_task(api_url, ca_file, job_id, (f"/v1/jobs/{job_id}/user-task", body), signals, early)
