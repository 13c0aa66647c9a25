"""What the batch script pipes into srun reaches the step's tasks as natively: srun forwards its
stdin to every task, or to the one `--input=N` names, and a step's srun in a script started with
`sbatch --input=FILE` reads the rest of that file. Bridged, every step read /dev/null: the script's
srun in the pod never sent its stdin, and Slurm's srun on the slurmd host had none.

The same script runs three times in `native` and in `k8s` at once, and the outputs must be the
same bytes; a step with `--input=none` leaves the script's stdin to the script (MPICH's mpiexec
starts its srun so). A whole file beyond what one request carries (512 KiB) is opened by Slurm's srun on
the slurmd host; a pipe beyond it ends the bridged srun with the reason, instead of running the
step on part of its input.
"""

from __future__ import annotations

import pytest

from tests.e2e.sandbox import Sandbox, job_trail, write_script

pytestmark = [pytest.mark.e2e, pytest.mark.shares_the_cluster]

JOBS_PER_PARTITION = 3
SCRIPT = """#!/bin/sh
#SBATCH -N1 -n2
#K8S image=sandbox.local/busybox:1
echo hi | srun -n1 cat
printf 'a\\nb\\n' | srun -n2 cat | sort
printf 'for task 1 only\\n' | srun -n2 --input=1 sh -c 'cat; echo "task $SLURM_PROCID read"' | sort
srun -n1 cat < {dir}/data.txt
srun -n1 --input=none sh -c 'cat; echo "with --input=none a step reads nothing"'
read first
echo "the script read: $first"
srun -n1 sh -c 'while read line; do echo "the step read: $line"; done'
echo "the step ended $?"
"""


def test_sruns_stdin_reaches_its_tasks_as_natively(bridge: Sandbox) -> None:
    directory = bridge.home("alice") / "srun-stdin"
    bridge.slurm("mkdir", "-p", str(directory), user="alice")
    bridge.slurm("sh", "-c", f"printf 'one\\ntwo\\nthree\\n' > {directory}/data.txt", user="alice")
    script = write_script(bridge, "alice", "srun-stdin/pipe.sh", SCRIPT.format(dir=directory))
    jobs = {(partition, copy): bridge.sbatch("-p", partition, f"--input={directory}/data.txt",
                                             "-o", f"{directory}/{partition}-%j.out", str(script))
            for partition in ("native", "k8s") for copy in range(JOBS_PER_PARTITION)}
    outputs = {}
    for (partition, copy), job_id in jobs.items():
        row = bridge.wait_job_final(job_id, timeout=240)
        text = (directory / f"{partition}-{job_id}.out").read_text(errors="replace")
        assert (row["State"], row["ExitCode"]) == ("COMPLETED", "0:0"), f"{row}\n{text}\n{job_trail(job_id)}"
        outputs[(partition, copy)] = text
    native = outputs[("native", 0)]
    assert native == (
        "hi\na\na\nb\nb\nfor task 1 only\ntask 0 read\ntask 1 read\none\ntwo\nthree\n"
        "with --input=none a step reads nothing\n"
        "the script read: one\nthe step read: two\nthe step read: three\nthe step ended 0\n"), native
    for job, text in outputs.items():
        assert text == native, f"{job}: {text!r}\nnative: {native!r}"


BIG = 600_000
BIG_SCRIPT = """#!/bin/sh
#SBATCH -N1 -n2
#K8S image=sandbox.local/busybox:1
srun -n2 wc -c < {dir}/big.dat
srun -n1 wc -c
echo "the script then read $(head -c 1000 | wc -c)"
"""


def test_a_file_too_big_for_a_request_reaches_the_tasks_whole_as_natively(bridge: Sandbox) -> None:
    """More than a request carries, from a whole file (`srun prog < big`, an sbatch --input file
    the script has not read): Slurm's srun opens it on the slurmd host, and the script's stdin is
    at its end after, as native srun leaves it."""
    directory = bridge.home("alice") / "srun-stdin-big"
    bridge.slurm("mkdir", "-p", str(directory), user="alice")
    bridge.slurm("sh", "-c", f"head -c {BIG} /dev/urandom > {directory}/big.dat", user="alice")
    script = write_script(bridge, "alice", "srun-stdin-big/big.sh", BIG_SCRIPT.format(dir=directory))
    jobs = {(partition, copy): bridge.sbatch("-p", partition, f"--input={directory}/big.dat",
                                             "-o", f"{directory}/{partition}-%j.out", str(script))
            for partition in ("native", "k8s") for copy in range(2)}
    for (partition, _), job_id in jobs.items():
        row = bridge.wait_job_final(job_id, timeout=240)
        text = (directory / f"{partition}-{job_id}.out").read_text(errors="replace")
        assert (row["State"], row["ExitCode"]) == ("COMPLETED", "0:0"), f"{row}\n{text}\n{job_trail(job_id)}"
        assert text == f"{BIG}\n{BIG}\n{BIG}\nthe script then read 0\n", f"{partition}: {text!r}"


def test_more_stdin_than_a_request_carries_ends_srun_with_the_reason(bridge: Sandbox) -> None:
    script = write_script(bridge, "alice", "srun-stdin-big.sh",
                          "#!/bin/sh\n#K8S image=sandbox.local/busybox:1\n"
                          "head -c 600000 /dev/zero | srun -n1 wc -c\necho \"srun ended $?\"\n"
                          "head -c 500000 /dev/zero | srun -n1 wc -c\n")
    out = bridge.home("alice") / "srun-stdin-big.out"
    out.unlink(missing_ok=True)
    job_id = bridge.sbatch("-p", "k8s", "-o", str(out), str(script))
    row = bridge.wait_job_final(job_id, timeout=120)
    text = out.read_text(errors="replace")
    assert row["State"] == "COMPLETED", f"{row}\n{text}\n{job_trail(job_id)}"
    assert text.splitlines() == [
        "srun: error: a job that runs in Kubernetes passes at most 512 KiB of srun's stdin to its step; "
        "give larger input as a file: srun --input=FILE",
        "srun ended 1",
        "500000",
    ], text


# As Snakemake's SLURM executor starts each rule's step (snakemake-executor-plugin-slurm-jobstep):
# Popen(..., stdin=PIPE) and wait(), the pipe never written nor closed. Native srun starts the step
# at once; the bridged one read its stdin to the end first, and both waited until the time limit.
# A caller that computes before it writes, and a sibling that writes only after srun's wait for a
# first byte: both read to their end, as before.
CALLER_SCRIPT = """#!/bin/sh
#SBATCH -N1 -n1 --time=2
python3 - <<'PY'
import subprocess, time
step = subprocess.Popen("srun -n1 --cpu-bind=q sh -c 'echo the step ran'", shell=True,
                        stdin=subprocess.PIPE, text=True)
print("srun ended", step.wait(), flush=True)
step = subprocess.Popen(["srun", "-n1", "cat"], stdin=subprocess.PIPE)
time.sleep(2.5)  # the caller computes what it writes: it is not waiting for srun
step.communicate(b"written after 2.5 s\\n")
print("srun ended", step.returncode, flush=True)
PY
echo "a sibling's pipe: $( (sleep 2; echo late) | srun -n1 cat )"
"""


def test_a_callers_open_silent_pipe_does_not_hold_the_step_as_natively(bridge: Sandbox) -> None:
    directory = bridge.home("alice") / "srun-stdin-caller"
    bridge.slurm("mkdir", "-p", str(directory), user="alice")
    script = write_script(bridge, "alice", "srun-stdin-caller/caller.sh", CALLER_SCRIPT)
    jobs = {(partition, copy): bridge.sbatch("-p", partition, "-o", f"{directory}/{partition}-%j.out",
                                             str(script))
            for partition in ("native", "k8s") for copy in range(JOBS_PER_PARTITION)}
    for (partition, _), job_id in jobs.items():
        row = bridge.wait_job_final(job_id, timeout=240)
        text = (directory / f"{partition}-{job_id}.out").read_text(errors="replace")
        assert (row["State"], row["ExitCode"]) == ("COMPLETED", "0:0"), f"{row}\n{text}\n{job_trail(job_id)}"
        assert text == ("the step ran\nsrun ended 0\nwritten after 2.5 s\nsrun ended 0\n"
                        "a sibling's pipe: late\n"), f"{partition}: {text!r}"
