"""What a script and its step's tasks find in their environment is what slurmstepd gives them
natively, with the image's own PATH: the same script runs in `native` and `k8s` at once (three
jobs in each), each writes `env` of its batch step and of both tasks of a step, and every SLURM_*
variable must be the same once job ids, node names and what names a time, a port or the host's
slurm.conf are set aside.

- No RANK, WORLD_SIZE, NODE_RANK, MASTER_ADDR or MASTER_PORT: Slurm sets none, and code that
  prefers RANK to SLURM_PROCID (torchrun-aware training scripts) took every task of a bridged step
  for rank 0 of a world of one.
- SLURM_STEP_ID/SLURM_STEPID of the batch step (-5), and SLURM_TASK_PID naming the script's or the
  task's own process (a step task's was its proxy's on the slurmd host).
- The image's PATH: busybox's starts with /opt/busybox-image/bin, as a conda or CUDA image's starts
  with its own directories; the pod's spec set a PATH of its own over it, and such an image's
  programs were not found. The agent's bin directory (srun, Slurm's commands) comes first.
- The submitted PATH's directories on shared volumes: `conda activate env; sbatch job.sh` runs the
  env's python natively; the bridge dropped the whole submitted PATH as the slurmd host's. So with
  LD_LIBRARY_PATH (`module load` of a tree the pods mount, ~/lib).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e.sandbox import Sandbox, job_trail, write_script

pytestmark = [pytest.mark.e2e, pytest.mark.shares_the_cluster]

JOBS_PER_PARTITION = 3
IMAGE_PATH = "/opt/busybox-image/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
AGENT_BIN = "/slurm-k8s-bridge-bin/bin"

SCRIPT = """#!/bin/sh
#SBATCH -N1 -n2
#K8S image=sandbox.local/busybox:1
env | sort > {dir}/batch-$SLURM_JOB_ID.env
echo "script pid $$ SLURM_TASK_PID $SLURM_TASK_PID"
srun sh -c 'env | sort > {dir}/step-$SLURM_JOB_ID-$SLURM_PROCID.env
echo "task $SLURM_PROCID pid $$ SLURM_TASK_PID $SLURM_TASK_PID"' | sort
"""

PROBE = """#!/bin/sh
#K8S image=sandbox.local/busybox:1
echo "PATH=$PATH"
command -v srun
image-path-probe
srun -n1 sh -c 'image-path-probe; echo "task PATH=$PATH"'
"""

# Not compared: they name a time, a port, a process or the job's partition, or (SLURM_CONF) the
# slurmd host's slurm.conf, which no pod has: Slurm's commands in the pod are the agent's.
DIFFERENT_BY_NATURE = {
    "SLURM_JOB_SLUID", "SLURM_JOB_START_TIME", "SLURM_JOB_END_TIME", "SLURM_TASK_PID",
    "SLURM_SRUN_COMM_PORT", "SLURM_STEP_LAUNCHER_PORT", "SLURM_JOB_PARTITION", "SLURM_CONF",
}
NOT_SLURMS = ("RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")


def _slurm_variables(path: Path, job_id: int) -> dict[str, str]:
    variables = {}
    for line in path.read_text(errors="replace").splitlines():
        name, _, value = line.partition("=")
        if name.startswith("SLURM") and name not in DIFFERENT_BY_NATURE:
            value = value.replace(str(job_id), "JOBID")
            variables[name] = re.sub(r"\b(native|kreal)\d+\b", "NODE", value)
    return variables


def _not_slurms(path: Path) -> list[str]:
    return [line for line in path.read_text(errors="replace").splitlines()
            if line.partition("=")[0] in NOT_SLURMS]


def test_the_script_and_its_tasks_get_slurms_variables_as_natively(bridge: Sandbox) -> None:
    directory = bridge.home("alice") / "environment-parity"
    bridge.slurm("mkdir", "-p", str(directory), user="alice")
    script = write_script(bridge, "alice", "environment-parity.sh", SCRIPT.format(dir=directory))
    jobs = {(partition, copy): bridge.sbatch("-p", partition, "-o", f"{directory}/out-%j.txt", str(script))
            for partition in ("native", "k8s") for copy in range(JOBS_PER_PARTITION)}
    seen: dict[str, dict[str, dict[str, str]]] = {}
    for (partition, copy), job_id in jobs.items():
        row = bridge.wait_job_final(job_id, timeout=240)
        trail = f"{partition} job {job_id}: {row}\n{job_trail(job_id)}"
        assert (row["State"], row["ExitCode"]) == ("COMPLETED", "0:0"), trail
        output = (directory / f"out-{job_id}.txt").read_text(errors="replace").splitlines()
        pids = re.fullmatch(r"script pid (\d+) SLURM_TASK_PID (\d+)", output[0])
        assert pids and pids[1] == pids[2], f"{output}\n{trail}"
        for task, line in enumerate(output[1:]):
            pids = re.fullmatch(rf"task {task} pid (\d+) SLURM_TASK_PID (\d+)", line)
            assert pids and pids[1] == pids[2], f"{output}\n{trail}"
        files = {"batch": directory / f"batch-{job_id}.env",
                 **{f"task {task}": directory / f"step-{job_id}-{task}.env" for task in (0, 1)}}
        for what, path in files.items():
            assert not _not_slurms(path), f"{partition} {what}: {_not_slurms(path)}\n{trail}"
            seen.setdefault(what, {})[f"{partition} {copy}"] = _slurm_variables(path, job_id)
    for what, by_job in seen.items():
        native = by_job["native 0"]
        assert native["SLURM_STEP_ID"] == ("-5" if what == "batch" else "0"), native
        for job, variables in by_job.items():
            differing = {name: (native.get(name), variables.get(name))
                         for name in native.keys() | variables.keys()
                         if native.get(name) != variables.get(name)}
            assert not differing, f"{what} of {job} against native's: {differing}"


def test_the_script_and_its_tasks_find_the_images_programs_after_the_agents(bridge: Sandbox) -> None:
    script = write_script(bridge, "alice", "image-path.sh", PROBE)
    outputs = {}
    for copy in range(JOBS_PER_PARTITION):
        out = bridge.home("alice") / f"image-path-{copy}.out"
        out.unlink(missing_ok=True)
        outputs[bridge.sbatch("-p", "k8s", "-o", str(out), str(script))] = out
    for job_id, out in outputs.items():
        row = bridge.wait_job_final(job_id, timeout=240)
        text = out.read_text(errors="replace")
        assert (row["State"], row["ExitCode"]) == ("COMPLETED", "0:0"), f"{row}\n{text}\n{job_trail(job_id)}"
        assert text == (
            f"PATH={AGENT_BIN}:{IMAGE_PATH}\n"
            f"{AGENT_BIN}/srun\n"
            "image-path-probe: found on the image's PATH\n"
            "image-path-probe: found on the image's PATH\n"
            f"task PATH={AGENT_BIN}:{IMAGE_PATH}\n"
        ), f"{text}\n{job_trail(job_id)}"


SUBMITTED_PATH_PROBE = """#!/bin/sh
python3
tool-of-mine
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
srun -n1 sh -c 'python3; tool-of-mine; echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"'
"""


def test_the_submitted_paths_shared_directories_come_first_as_natively(bridge: Sandbox) -> None:
    """Directories of the user's on the shared home, first on the PATH sbatch was run with (an
    activated conda env, ~/bin): the script and its step's task find their programs there before
    the system's (a python3 of the env's own), in `native` and `k8s` alike, three jobs each at once."""
    env_bin = bridge.home("alice") / "submitted-path" / "env" / "bin"
    library = bridge.home("alice") / "submitted-path" / "env" / "lib"
    tools = bridge.home("alice") / "submitted-path" / "tools"
    bridge.slurm("mkdir", "-p", str(env_bin), str(tools), user="alice")
    for directory, program in ((env_bin, "python3"), (tools, "tool-of-mine")):
        write_script(bridge, "alice", str((directory / program).relative_to(bridge.home("alice"))),
                     f'#!/bin/sh\necho "{program} of the submitted PATH: $0"\n')
        bridge.slurm("chmod", "+x", str(directory / program), user="alice")
    script = write_script(bridge, "alice", "submitted-path.sh", SUBMITTED_PATH_PROBE)
    submitted_path = f"{env_bin}:/usr/bin:/bin:{tools}:{bridge.environ()['PATH']}"
    outputs: dict[tuple[str, int], tuple[int, Path]] = {}
    for partition in ("native", "k8s"):
        for copy in range(JOBS_PER_PARTITION):
            out = bridge.home("alice") / f"submitted-path-{partition}-{copy}.out"
            out.unlink(missing_ok=True)
            answer = bridge.slurm("env", f"PATH={submitted_path}", f"LD_LIBRARY_PATH={library}",
                                  "sbatch", "--parsable", "-p", partition,
                                  "-o", str(out), str(script), user="alice", cwd=str(bridge.home("alice")))
            outputs[(partition, copy)] = (int(answer.stdout.split(";")[0]), out)
    expected = (f"python3 of the submitted PATH: {env_bin}/python3\n"
                f"tool-of-mine of the submitted PATH: {tools}/tool-of-mine\n"
                f"LD_LIBRARY_PATH={library}\n") * 2
    for (partition, _), (job_id, out) in outputs.items():
        row = bridge.wait_job_final(job_id, timeout=240)
        text = out.read_text(errors="replace")
        assert (row["State"], row["ExitCode"]) == ("COMPLETED", "0:0"), f"{row}\n{text}\n{job_trail(job_id)}"
        assert text == expected, f"{partition} job {job_id}\n{job_trail(job_id)}"
