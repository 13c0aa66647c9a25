"""`sbatch --input=FILE` gives the batch script FILE as its stdin, as slurmstepd does natively
(the default is /dev/null). Bridged, the script read /dev/null whatever --input said. Now the
waiter names the file slurmstepd opened and the first pod's agent opens it, as the job's user,
through the partition volume that holds it.

The same array, each task reading its own file by the %a pattern, runs in `native` and `k8s` at
once; the outputs must be the same bytes. A file on no volume the pods share fails the bridged job
with a message naming it, in the job's output and in `scontrol show job`, instead of running the
script on an empty stdin.
"""

from __future__ import annotations

import pytest

from tests.e2e.sandbox import Sandbox, job_trail, wait_until, write_script

pytestmark = [pytest.mark.e2e, pytest.mark.shares_the_cluster]

TASKS = 3
SCRIPT = """#!/bin/sh
#K8S image=sandbox.local/busybox:1
echo "task $SLURM_ARRAY_TASK_ID reads:"
cat
echo "[end of stdin]"
srun -n1 sh -c 'read line && echo "a step read: $line" || echo "a step read nothing"'
"""


def _input(task: int) -> bytes:
    # a last line without a newline, a byte that is not UTF-8, an empty line
    return f"line one of {task}\n\nlast line of {task}\xff".encode("latin-1")


def test_each_array_task_reads_its_own_input_file_as_natively(bridge: Sandbox) -> None:
    directory = bridge.home("alice") / "sbatch-input"
    bridge.slurm("mkdir", "-p", str(directory), user="alice")
    for task in range(TASKS):
        # printf's octal escape writes the byte that is not UTF-8 (text mode would encode it)
        bridge.slurm("sh", "-c", f"printf 'line one of {task}\\n\\nlast line of {task}\\377' "
                     f"> {directory}/in-{task}.txt", user="alice")
        assert (directory / f"in-{task}.txt").read_bytes() == _input(task)
    script = write_script(bridge, "alice", "sbatch-input/read-stdin.sh", SCRIPT)
    arrays = {partition: bridge.sbatch("-p", partition, f"--array=0-{TASKS - 1}",
                                       f"--input={directory}/in-%a.txt",
                                       "-o", f"{directory}/{partition}-%A-%a.out", str(script))
              for partition in ("native", "k8s")}
    outputs: dict[str, list[bytes]] = {}
    for partition, array in arrays.items():
        rows = wait_until(f"array {array} to end", lambda a=array: bridge.array_rows(a, TASKS), 240)
        assert rows == ["COMPLETED|0:0"] * TASKS, f"{partition}: {rows}\n{job_trail(array)}"
        outputs[partition] = [(directory / f"{partition}-{array}-{task}.out").read_bytes()
                              for task in range(TASKS)]
    for task in range(TASKS):
        native = outputs["native"][task]
        read = f"task {task} reads:\n".encode() + _input(task) + b"[end of stdin]\n"
        assert native.startswith(read), native
        assert outputs["k8s"][task] == native, f"task {task}: k8s {outputs['k8s'][task]!r}, native {native!r}"


def test_an_input_file_no_pod_can_open_fails_the_job_naming_it(bridge: Sandbox) -> None:
    """/etc/hostname is on the slurmd host, on no volume the k8s partition's pods mount."""
    script = write_script(bridge, "alice", "sbatch-input-unshared.sh",
                          "#!/bin/sh\n#K8S image=sandbox.local/busybox:1\necho never\n")
    out = bridge.home("alice") / "sbatch-input-unshared.out"
    out.unlink(missing_ok=True)
    job_id = bridge.sbatch("-p", "k8s", "--input=/etc/hostname", "-o", str(out), str(script))
    row = bridge.wait_job_final(job_id, timeout=120)
    text = out.read_text(errors="replace")
    assert row["State"] == "FAILED", f"{row}\n{text}\n{job_trail(job_id)}"
    assert "never" not in text
    assert "sbatch --input=/etc/hostname: the file is not on a volume the pods share" in text, text
    shown = bridge.slurm("scontrol", "show", "job", str(job_id)).stdout
    assert "sbatch --input=/etc/hostname" in shown, shown
