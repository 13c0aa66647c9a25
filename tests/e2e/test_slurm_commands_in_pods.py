"""Slurm's own commands inside a bridged job's pod (issue 18): `scontrol show hostnames`,
`squeue` of itself, an `sbatch --dependency=afterok` chain and `scancel` of itself answer in a
busybox pod as natively, with the output of Slurm's own binaries, side by side with `native`.
And the door is the job's user's only: another user's job is as untouchable as natively, an
argument that would read a file or run a program on the slurmd host is refused with its reason,
and a forged or replayed request frame runs nothing."""

from __future__ import annotations

import os
import pwd
import re
import time
from pathlib import Path

import pytest

from tests.e2e.sandbox import SANDBOX_LOGS, Sandbox, job_trail, write_script
from tests.e2e.test_parity_output_and_signals import Case, _differences, _run_cases

pytestmark = [pytest.mark.e2e, pytest.mark.shares_the_cluster]

CHAIN = (
    "cat > next-$SLURM_JOB_ID.sh <<'EOS'\n#!/bin/sh\n#K8S image=sandbox.local/busybox:1\n"
    'echo "chained: $1, named $SLURM_JOB_NAME"\nEOS\n'
    "next=$(sbatch --parsable -p $SLURM_JOB_PARTITION -o next-%j.out "
    "--dependency=afterok:$SLURM_JOB_ID next-$SLURM_JOB_ID.sh)\n"
    'echo "sbatch said $?"\necho "$next" > next-id-$SLURM_JOB_ID\n'
    # Script arguments (a bridged job's script gets none today: a native job takes them).
    "args=$(sbatch --parsable -p native -o args-%j.out "
    "--dependency=afterok:$SLURM_JOB_ID next-$SLURM_JOB_ID.sh first-arg)\n"
    'echo "sbatch with arguments said $?"\necho "$args" > args-id-$SLURM_JOB_ID\n'
    # --wrap has no '#K8S image=' line: natively run, from either partition.
    "wrapped=$(sbatch --parsable -p native -o wrap-%j.out "
    "--dependency=afterok:$SLURM_JOB_ID --wrap 'echo wrapped ran')\n"
    'echo "sbatch --wrap said $?"\necho "$wrapped" > wrap-id-$SLURM_JOB_ID\n'
    "printf '#!/bin/sh\\n#K8S image=sandbox.local/busybox:1\\ntrue\\n' | "
    "sbatch --test-only -p $SLURM_JOB_PARTITION >/dev/null 2>&1\n"
    'echo "no script: $?"\n'
)

CASES = [
    Case("hostnames", 'scontrol show hostnames "$SLURM_JOB_NODELIST"\necho "rc $?"\n'
         'echo "first: $(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)"\n'
         # With no list, scontrol reads SLURM_NODELIST (PSI/J writes its node file so).
         'scontrol show hostnames\necho "no list: rc $?"\n', args=("-N", "2")),
    Case("squeue_itself", 'squeue -h -j $SLURM_JOB_ID -o %T\necho "rc $?"\n'
         'sacct -n -X -j $SLURM_JOB_ID -o State%-10\nsinfo -h -p $SLURM_JOB_PARTITION -o %a\n'),
    Case("sbatch_chain", CHAIN),
    # exec: natively the TERM reaches the sleep and the shell one by one, and a shell that sees
    # its child die first goes on to the next line (as the parity suite's time_limit case).
    # Nothing printed after scancel: natively the TERM may come before the next line runs.
    Case("scancel_itself", 'echo before\nscancel $SLURM_JOB_ID && exec sleep 30\necho "scancel said $?"\n'),
    # sstat of the job's running step, and the version of Slurm (MPI launchers ask srun's).
    Case("sstat_and_versions",
         "f=step-$SLURM_JOB_ID\n"
         "srun -n 1 sh -c \"touch $f.up; while [ ! -e $f.done ]; do sleep 0.2; done\" &\n"
         "while [ ! -e $f.up ]; do sleep 0.2; done\n"
         "sstat -n -P -j $SLURM_JOB_ID.0 -o NTasks\necho \"sstat rc $?\"\n"
         "srun --version\necho \"srun rc $?\"\nsbatch -V\nsstat --version\ntouch $f.done\nwait\n",
         stderr_file=True),
    # Slurm's own refusals, from Slurm's own binaries: the same words in both.
    Case("slurm_refuses", "squeue --states=nonsense\necho \"rc $?\"\nscontrol show job 999999999\n"
         "echo \"rc $?\"\n", stderr_file=True),
]


def _workdir(sandbox: Sandbox, name: str) -> Path:
    workdir = sandbox.home("alice") / f"{name}-{int(time.time())}"
    workdir.mkdir()
    user = pwd.getpwnam("alice")
    os.chown(workdir, user.pw_uid, user.pw_gid)
    return workdir


def _chained(sandbox: Sandbox, workdir: Path, parent: int, kind: str) -> tuple[str, bytes]:
    """The chained job's state and output, once it has ended; it must have started after its
    parent ended."""
    child = int((workdir / f"{kind}-id-{parent}").read_text().strip())
    final = sandbox.wait_job_final(child, timeout=180)
    times = sandbox.slurm("sacct", "-n", "-X", "-P", "-j", f"{parent},{child}", "-o",
                          "JobID,Start,End").stdout
    rows = {int(line.split("|")[0]): line.split("|")[1:] for line in times.splitlines()}
    assert rows[child][0] >= rows[parent][1], f"job {child} started before its parent {parent} ended: {rows}"
    return final["State"], (workdir / f"{kind}-{child}.out").read_bytes()


def test_slurm_commands_in_a_busybox_pod_answer_as_natively(bridge: Sandbox) -> None:
    workdir = _workdir(bridge, "commands")
    jobs: dict[tuple[str, str], int] = {}
    outcomes = _run_cases(bridge, CASES, ("native", "k8s"), workdir, jobs)
    found = [line for case in CASES for line in _differences(
        case.name, outcomes[(case.name, "native")], outcomes[(case.name, "k8s")])]
    if found:
        for case in CASES:
            print(f"=== {case.name}: job {jobs[(case.name, 'k8s')]}\n{job_trail(jobs[(case.name, 'k8s')])}")
    assert not found, "\n".join(found)
    # What the parity holds to, so that two equally broken sides cannot pass.
    hostnames = outcomes[("hostnames", "k8s")][1][".out"]
    assert hostnames == b"NODE\nNODE\nrc 0\nfirst: NODE\nNODE\nNODE\nno list: rc 0\n", hostnames
    versions = outcomes[("sstat_and_versions", "k8s")][1][".out"]
    assert re.fullmatch(rb"1\nsstat rc 0\n(slurm\S* 26\.05\.\d+\n)srun rc 0\n\1\1", versions), versions
    squeue = outcomes[("squeue_itself", "k8s")][1][".out"]
    assert re.fullmatch(rb"RUNNING\nrc 0\nRUNNING *\nup\n", squeue), squeue
    assert outcomes[("scancel_itself", "k8s")][0] is not None
    assert ("N", "CANCELLED", "0:0") in outcomes[("scancel_itself", "k8s")][0]
    assert b"scancel said" not in outcomes[("scancel_itself", "k8s")][1][".out"]  # it succeeded
    assert outcomes[("sbatch_chain", "k8s")][1][".out"] == (
        b"sbatch said 0\nsbatch with arguments said 0\nsbatch --wrap said 0\nno script: 0\n")
    for part in ("native", "k8s"):
        parent = jobs[("sbatch_chain", part)]
        name = f"next-{parent}.sh".encode()
        assert _chained(bridge, workdir, parent, "next") == ("COMPLETED", b"chained: , named " + name + b"\n")
        assert _chained(bridge, workdir, parent, "args") == (
            "COMPLETED", b"chained: first-arg, named " + name + b"\n")
        assert _chained(bridge, workdir, parent, "wrap") == ("COMPLETED", b"wrapped ran\n")


CONCURRENT = (
    "#!/bin/sh\n#K8S image=sandbox.local/busybox:1\n"
    "i=0\nwhile [ $i -lt 6 ]; do\n"
    '  (echo "$i $(squeue -h -j $SLURM_JOB_ID -o %T) $(scontrol show hostnames "$SLURM_JOB_NODELIST" '
    '| wc -l)" > q-$SLURM_JOB_ID-$i) &\n  i=$((i+1))\ndone\nwait\ncat q-$SLURM_JOB_ID-* | sort\n'
    "rm -f q-$SLURM_JOB_ID-*\n"
)


def test_many_jobs_run_many_commands_at_once(bridge: Sandbox) -> None:
    """Eight two-node jobs at once, each running six pairs of commands at once."""
    workdir = _workdir(bridge, "commands-concurrent")
    script = write_script(bridge, "alice", "commands-concurrent.sh", CONCURRENT)
    jobs = [bridge.sbatch("-p", "k8s", "-N", "2", "-D", str(workdir), "-o", "conc-%j.out", str(script))
            for _ in range(8)]
    want = "".join(f"{i} RUNNING 2\n" for i in range(6))
    for job in jobs:
        final = bridge.wait_job_final(job, timeout=240)
        out = (workdir / f"conc-{job}.out").read_text()
        assert (final["State"], out) == ("COMPLETED", want), f"job {job}: {final} {out!r}\n{job_trail(job)}"


def test_another_users_job_is_as_untouchable_as_natively(bridge: Sandbox) -> None:
    workdir = _workdir(bridge, "commands-other-user")
    bobs = write_script(bridge, "bob", "bobs-sleeper.sh", "#!/bin/sh\nsleep 300\n")
    bob_job = bridge.sbatch("-p", "native", "-o", "/dev/null", str(bobs), user="bob")
    try:
        case = Case("other_user",
                    f"scancel {bob_job}\necho \"scancel said $?\"\n"
                    f"scontrol hold {bob_job}\necho \"hold said $?\"\n"
                    "sbatch --uid=bob --wrap true\necho \"sbatch --uid said $?\"\n", stderr_file=True)
        outcomes = _run_cases(bridge, [case], ("native", "k8s"), workdir)
        found = _differences(case.name, outcomes[(case.name, "native")], outcomes[(case.name, "k8s")])
        assert not found, "\n".join(found)
        err = outcomes[(case.name, "k8s")][1][".err"]
        assert b"scancel: error: Kill job error on job id" in err and b"denied" in err, err
        said = outcomes[(case.name, "k8s")][1][".out"]  # Slurm's own codes (scancel's is 210)
        refused = rb"scancel said [1-9]\d*\nhold said [1-9]\d*\nsbatch --uid said [1-9]\d*\n"
        assert re.fullmatch(refused, said), said
        state = bridge.slurm("squeue", "-h", "-j", str(bob_job), "-o", "%T", check=False).stdout.strip()
        assert state in ("RUNNING", "PENDING"), f"bob's job {bob_job} is {state!r}"
    finally:
        bridge.slurm("scancel", str(bob_job), check=False)


def _refused_case(marker: Path, host_script: Path) -> str:
    return (
        "#!/bin/sh\n#K8S image=sandbox.local/busybox:1\n"
        f"sbatch -p native {host_script}\necho \"host script path: $?\"\n"
        "sbatch --get-user-env -p native --wrap true\necho \"get-user-env: $?\"\n"
        "sbatch --export-file=/etc/environment -p native --wrap true\necho \"export-file: $?\"\n"
        "sbatch --export-f=3 -p native --wrap true\necho \"export-file abbreviated: $?\"\n"
        "sbatch -F /etc/hosts -p native --wrap true\necho \"nodefile: $?\"\n"
        "scontrol listpids\necho \"listpids: $?\"\n"
        "scontrol write batch_script $SLURM_JOB_ID /tmp/x\necho \"write: $?\"\n"
        "scontrol\necho \"interactive: $?\"\n"
        "squeue --no-such-option\necho \"unknown option: $?\"\n"
        "sacct --file=/etc/shadow\necho \"sacct file: $?\"\n"
        # Frames written straight into the agent's log (the script's parent; PID 1 is the pod's
        # pause): a used key replayed with another command, and a command that is not Slurm's.
        # The agent is non-dumpable, so the write itself is refused (were it not, the daemon
        # would refuse both: unit-tested).
        "squeue -h -j $SLURM_JOB_ID -o %T >/dev/null\n"
        "frame() { printf 'c %s\\n' \"$(printf '%s' \"$1\" | base64 | tr -d '\\n')\" 2>/dev/null "
        "> /proc/$PPID/fd/1; echo \"frame: $?\"; }\n"
        f"frame '{{\"key\":\"1\",\"command\":\"sbatch\",\"argv\":[\"-p\",\"native\",\"--wrap\","
        f"\"touch {marker}.replayed\"],\"cwd\":\"/\"}}'\n"
        f"frame '{{\"key\":\"900\",\"command\":\"sh\",\"argv\":[\"-c\",\"touch {marker}.sh\"],"
        "\"cwd\":\"/\"}'\n"
        "sleep 5\necho done\n"
    )


def test_nothing_the_user_chose_runs_on_the_slurmd_host(bridge: Sandbox) -> None:
    workdir = _workdir(bridge, "commands-refused")
    marker = workdir / "probe"  # alice may write there, wherever a wrongly run probe runs
    # A script only the slurmd host has (the sandbox's state directory is visible in the Slurm
    # rootfs, not in the pod): were its path handed to sbatch there, it would run natively.
    host_script = SANDBOX_LOGS.parent / f"commands-host-only-{int(time.time())}.sh"
    host_script.write_text(f"#!/bin/sh\ntouch {marker}.host-script\n")
    host_script.chmod(0o755)
    try:
        script = write_script(bridge, "alice", "commands-refused.sh", _refused_case(marker, host_script))
        job = bridge.sbatch("-p", "k8s", "-D", str(workdir), "-o", "refused-%j.out", "-e", "refused-%j.err",
                            str(script))
        final = bridge.wait_job_final(job, timeout=120)
        out = (workdir / f"refused-{job}.out").read_text()
        err = (workdir / f"refused-{job}.err").read_text()
        context = f"{final}\n--- out\n{out}\n--- err\n{err}\n{job_trail(job)}"
        for what in ("host script path", "get-user-env", "export-file", "export-file abbreviated", "nodefile",
                     "listpids", "write", "interactive", "unknown option", "sacct file"):
            assert f"{what}: 1\n" in out, f"{what} not refused with 1: {context}"
        for reason in (f"sbatch: error: Unable to open file {host_script}",
                       "option --get-user-env is not allowed inside a job that runs in Kubernetes: it runs",
                       "option --export-file is not allowed", "option -F is not allowed",
                       "scontrol listpids is not available", "scontrol write is not available",
                       "interactive scontrol is not available", "option '--no-such-option' is not allowed",
                       "sacct: option --file is not allowed"):
            assert reason in err, f"no {reason!r} on stderr: {context}"
        assert out.endswith("done\n"), context
        time.sleep(5)  # anything wrongly submitted would have run by now (native starts at once)
        ran = sorted(p.name for p in marker.parent.glob(f"{marker.name}.*"))
        assert not ran, f"ran on a host: {ran}\n{context}"
        daemon_log = "\n".join(line for log in SANDBOX_LOGS.glob("bridge*.log")
                               for line in log.read_text(errors="replace").splitlines()
                               if f'"job_id": {job},' in line)
        # The forged frames never reached the agent's log: nothing of them was even looked at.
        written = re.findall(r"^frame: (\d+)$", out, re.MULTILINE)
        assert len(written) == 2 and "0" not in written, context
        assert "command.replayed" not in daemon_log and "'sh' is not one of" not in daemon_log, \
            daemon_log[-3000:]
        assert final["State"] == "COMPLETED", context
    finally:
        host_script.unlink(missing_ok=True)
        for leftover in marker.parent.glob(f"{marker.name}.*"):
            leftover.unlink()
