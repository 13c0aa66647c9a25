"""srun's own options inside a batch job (issue 18), side by side in `native` and `k8s`: the per-step
files of --output/--error/--input/--open-mode/--unbuffered with Slurm's %-patterns, --chdir and
--multi-prog, compared byte for byte (file names and contents) after normalising job ids and node
names, with the sacct rows of the job and its steps; several jobs at once. Then each option the
bridge refuses: its reason on the stderr of the script's srun, and the job ending as it does
natively after a failed srun. Then hostile paths: nobody reads or writes through a step's files
what the user could not natively.
"""

from __future__ import annotations

import os
import pwd
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.sandbox import Sandbox, job_trail, wait_until, write_script
from tests.e2e.test_parity_output_and_signals import _sacct

pytestmark = [pytest.mark.e2e, pytest.mark.shares_the_cluster]

SCRIPT = r"""#!/bin/sh
#K8S image=sandbox.local/busybox:1
printf 'line1\nline2\nno newline' > in.txt
srun --output=%x-%j-%t.out --error=%x-%j-%t.err --unbuffered \
  sh -c 'echo out $SLURM_PROCID; echo err $SLURM_PROCID >&2; printf "partial $SLURM_PROCID"'
echo "srun said $?"
srun --output=%x-%j-%t.out --error=%x-%j-%t.err --open-mode=append \
  sh -c 'echo appended $SLURM_PROCID; echo appended-err >&2'
srun --input=in.txt --output=%x-%j-in-%t.out sh -c 'cat; echo; echo rank $SLURM_PROCID'
srun -n 1 -N 1 -o %x-%j-single.out -e %x-%j-single.err sh -c 'echo one; echo two >&2; exit 3'
echo "srun said $?"
srun -o %x-%j-%N-%n-%t-%s.out sh -c 'echo node $SLURM_NODEID task $SLURM_PROCID'
srun --output=%x-%j-merged-%t.out sh -c 'echo o1; echo e1 >&2; echo o2'
srun -n 1 -N 1 --output=none sh -c 'echo gone'
srun -n 1 -N 1 --error=none sh -c 'echo kept; echo gone >&2'
mkdir -p sub
srun -n 1 -N 1 -D sub -o rel-%j.out sh -c 'basename $(pwd)'
printf '0 echo zero %%t %%o\n1 echo one %%t %%o\n' > mp.conf
srun --multi-prog --output=%x-%j-mp-%t.out mp.conf
export FOO=foo
srun -n 1 -N 1 --export=NONE /bin/sh -c 'echo "none: FOO=${FOO-unset} HOME=${HOME-unset}"'
srun -n 1 -N 1 --export=NONE sh -c true 2>/dev/null; echo "none without a path: $?"
srun -n 1 -N 1 --export=FOO,BAZ=baz /bin/sh -c 'echo "list: $FOO $BAZ HOME=${HOME-unset}"'
srun -n 1 -N 1 --export=FOO sh -c true 2>/dev/null; echo "list without a path: $?"
srun -n 1 -N 1 --export=ALL,BAZ=baz sh -c 'echo "all: $FOO $BAZ"'
echo done
"""
"""Each srun line is one per-step-file habit (and --export's three forms: without ALL there is no
PATH, so `sh` is not found; a shell's own default PATH differs by image, so it is not printed);
-N 2 -n 2 puts a task on each node."""


def _normalise(text: str, job: int) -> str:
    # The id as a whole number only (the sandbox's ids have four digits or more: FirstJobId).
    text = re.sub(rf"(?<![0-9]){job}(?![0-9])", "J", text)
    return re.sub(r"\b(native|kreal)([0-9])\b", r"NODE", text)


def _files(directory: Path, job: int) -> dict[str, bytes]:
    """Every file the job left in its directory (but the script's own), by normalised name."""
    found = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file() and path.name != "job.sh":
            name = _normalise(str(path.relative_to(directory)), job)
            found[name] = _normalise(path.read_bytes().decode(errors="replace"), job).encode()
    return found


def _directory(sandbox: Sandbox, name: str) -> Path:
    path = sandbox.home("alice") / name
    path.mkdir(parents=True)
    user = pwd.getpwnam("alice")
    os.chown(path, user.pw_uid, user.pw_gid)
    return path


def _run(sandbox: Sandbox, copies: int) -> None:
    base = f"srunopts-{int(time.time() * 1000)}"
    jobs: dict[tuple[str, int], tuple[int, Path]] = {}
    for part in ("native", "k8s"):
        for copy in range(copies):
            workdir = _directory(sandbox, f"{base}/{part}-{copy}")
            script = write_script(sandbox, "alice", f"{base}/{part}-{copy}/job.sh", SCRIPT)
            job = sandbox.sbatch("-p", part, "-N", "2", "-n", "2", "-J", "stepio", "-D", str(workdir),
                                 "-o", "batch-%j.out", "-e", "batch-%j.err", str(script))
            jobs[(part, copy)] = (job, workdir)
    for key, (job, _) in jobs.items():
        wait_until(f"{key} final in sacct", lambda j=job: _sacct(sandbox, j), timeout=240)
    time.sleep(3)  # slurmdbd may record a job's end before its batch step's
    problems = []
    for copy in range(copies):
        native_job, native_dir = jobs[("native", copy)]
        k8s_job, k8s_dir = jobs[("k8s", copy)]
        want, got = _files(native_dir, native_job), _files(k8s_dir, k8s_job)
        assert len(want) >= 16, f"native wrote only {sorted(want)}"
        if sorted(want) != sorted(got):
            problems.append(f"copy {copy}: files native {sorted(want)} != k8s {sorted(got)}")
        for name in sorted(set(want) & set(got)):
            if want[name] != got[name]:
                problems.append(f"copy {copy} {name}: native {want[name]!r} != k8s {got[name]!r}")
        if _sacct(sandbox, native_job) != _sacct(sandbox, k8s_job):
            problems.append(f"copy {copy}: sacct native {_sacct(sandbox, native_job)} != "
                            f"k8s {_sacct(sandbox, k8s_job)}")
        if problems:
            print(job_trail(k8s_job))
    assert not problems, "\n".join(problems)


def test_per_step_files_are_the_same_bytes_in_native_and_k8s(bridge: Sandbox) -> None:
    _run(bridge, 1)


def test_per_step_files_of_several_jobs_at_once(bridge: Sandbox) -> None:
    _run(bridge, 4)


REFUSED = {
    "--prolog=/home/alice/p.sh": "it would run a program on the slurmd host, outside the job's pods",
    "--epilog=/home/alice/p.sh": "it would run a program on the slurmd host, outside the job's pods",
    "--task-prolog=/home/alice/p.sh": "it would run a program on the slurmd host, outside the job's pods",
    "--task-epilog=/home/alice/p.sh": "it would run a program on the slurmd host, outside the job's pods",
    "--bcast=/tmp/copied": "it copies a file onto the step's nodes, which here are the slurmd hosts",
    "--container=/home/alice/bundle": "it runs the task in an OCI container on the slurmd host",
    "--cpu-freq=high": "slurmstepd would set the slurmd host's CPU frequency",
    "--output=/tmp/x-%t.out": "/tmp/x-%t.out is not on a volume the pods share with the slurmd host",
    "--input=/etc/hostname": "/etc/hostname is not on a volume the pods share with the slurmd host",
    "--nodefile=/home/alice/nodes": "it would read the file on the slurmd host",
}


def test_each_refused_option_says_why_on_sruns_stderr_and_fails_as_natively(bridge: Sandbox) -> None:
    base = f"srunrefused-{int(time.time() * 1000)}"
    workdir = _directory(bridge, base)
    # The exit code natively of a script whose srun failed on an option: the reference.
    native_script = write_script(bridge, "alice", f"{base}/native.sh",
                                 "#!/bin/sh\necho before\nsrun --no-such-option true\n")
    native = bridge.sbatch("-p", "native", "-D", str(workdir), "-o", "native-%j.out", "-e", "native-%j.err",
                           str(native_script))
    jobs = {}
    for i, option in enumerate(REFUSED):
        script = write_script(bridge, "alice", f"{base}/refused-{i}.sh",
                              "#!/bin/sh\n#K8S image=sandbox.local/busybox:1\necho before\n"
                              f"srun {option} true 2>srun-{i}.err\necho \"srun said $?\"\n"
                              f"srun {option} true\n")
        jobs[option] = bridge.sbatch("-p", "k8s", "-D", str(workdir), "-o", f"refused-{i}.out",
                                     "-e", f"refused-{i}.err", str(script))
    native_row = bridge.wait_job_final(native, timeout=120)
    assert native_row["State"] == "FAILED"
    for i, (option, reason) in enumerate(REFUSED.items()):
        row = bridge.wait_job_final(jobs[option], timeout=180)
        name = option.split("=")[0]
        said = (workdir / f"srun-{i}.err").read_text()
        out = (workdir / f"refused-{i}.out").read_text()
        err = (workdir / f"refused-{i}.err").read_text()
        context = f"{option}: srun's stderr {said!r}, out {out!r}, err {err!r}\n{job_trail(jobs[option])}"
        assert said.startswith(f"srun: error: option {name}"), context
        assert " is not available in a job that runs in Kubernetes: " in said, context
        assert reason in said, context
        assert out == "before\nsrun said 255\n", context  # srun's code for an option it cannot take
        assert reason in err, context  # the last srun's stderr is the job's
        assert (row["State"], row["ExitCode"]) == (native_row["State"], native_row["ExitCode"]), context
        steps = bridge.slurm("sacct", "-n", "-P", "-j", str(jobs[option]), "-o", "JobID").stdout.split()
        assert not [s for s in steps if re.fullmatch(rf"{jobs[option]}\.\d+", s)], f"{option}: a step ran"


PROBE = 'if [ -e /usr/sbin/slurmd ]; then echo ON_SLURMD_HOST; else echo IN_POD; fi'


def test_step_files_open_nothing_the_user_could_not_and_run_nothing_on_the_host(bridge: Sandbox) -> None:
    """Hostile alice: bob's private file as --input (by name and through her own symlink), --output
    into bob's home (by name and through a symlink), a --multi-prog line and a --chdir that probe
    where they run. slurmstepd and srun open the files as alice on the slurmd host, so each fails
    as it would natively; every program runs in a pod. (--overlap: natively too, a step whose srun
    could not open its --input stays RUNNING in slurmctld and holds its CPUs until the job ends.)"""
    stamp = int(time.time() * 1000)
    secret = bridge.home("bob") / f"secret-{stamp}"
    planted = [bridge.home("bob") / f"planted-{stamp}{suffix}" for suffix in ("", "-0", "-link")]
    subprocess.run(["runuser", "-u", "bob", "--", "sh", "-c", f"umask 077; echo BOB-SECRET > {secret}"],
                   check=True, timeout=30)
    workdir = _directory(bridge, f"srunhostile-{stamp}")
    script = write_script(bridge, "alice", f"srunhostile-{stamp}/job.sh", f"""#!/bin/sh
#K8S image=sandbox.local/busybox:1
ln -s {secret} link-in
ln -s {planted[2]} link-out
srun --overlap -n 1 --input={secret} cat; echo "by name $?"
srun --overlap -n 1 --input=link-in cat; echo "by link $?"
srun --overlap -n 1 --output={planted[0]} echo planted; echo "out by name $?"
srun --overlap -n 1 --output={bridge.home("bob")}/planted-{stamp}-%t echo planted; echo "per-task by name $?"
srun --overlap -n 1 --output=link-out echo planted; echo "out by link $?"
cat > probe.sh <<'X'
{PROBE}
X
printf '* sh probe.sh\\n' > mp.conf
srun --multi-prog mp.conf
srun -n 1 -D / sh -c '{PROBE}'
""")
    job = bridge.sbatch("-p", "k8s", "-n", "2", "-D", str(workdir), "-o", "out.txt", str(script))
    bridge.wait_job_final(job, timeout=180)
    out = (workdir / "out.txt").read_text()
    context = f"{out}\n{job_trail(job)}"
    assert "BOB-SECRET" not in out, context
    for path in workdir.rglob("*"):
        if path.is_file() and not path.is_symlink():  # alice's links to bob's file: root reads them
            assert "BOB-SECRET" not in path.read_text(errors="replace"), path
    for path in planted:
        assert not path.exists(), f"{path} was written: {context}"
    assert "ON_SLURMD_HOST" not in out, context
    assert out.count("IN_POD") == 3, context  # two --multi-prog tasks and the --chdir one
    for what in ("by name", "by link", "out by name", "per-task by name", "out by link"):
        assert re.search(rf"^{what} [1-9][0-9]*$", out, re.M), f"{what}: {context}"


NAMED_STEPS = """#!/bin/sh
#K8S image=sandbox.local/busybox:1
srun -n 1 true
srun -n 1 /bin/sh -c true
srun -n 1 -J mine sh -c 'echo "named: $SLURM_JOB_NAME"'
srun -n 1 sh -c 'echo "unnamed: $SLURM_JOB_NAME"'
printf '0 echo multi\\n' > steps.conf
srun -n 1 --multi-prog steps.conf
"""


def test_steps_are_named_in_sacct_as_natively(bridge: Sandbox) -> None:
    """sacct's JobName of each step is its command's base name, or the -J given to its srun, as
    natively (a bridged step was named after the waiter, which Slurm's srun runs for it); the tasks
    see the script's SLURM_JOB_NAME unless -J. Two jobs per partition at once. Found by the
    Snakemake probe."""
    base = f"stepnames-{int(time.time() * 1000)}"
    jobs: dict[tuple[str, int], tuple[int, Path]] = {}
    for part in ("native", "k8s"):
        for copy in range(2):
            workdir = _directory(bridge, f"{base}/{part}-{copy}")
            script = write_script(bridge, "alice", f"{base}/{part}-{copy}/named.sh", NAMED_STEPS)
            jobs[(part, copy)] = (bridge.sbatch("-p", part, "-D", str(workdir), "-o", "out", str(script)),
                                  workdir)
    seen = {}
    for key, (job, workdir) in jobs.items():
        bridge.wait_job_final(job, timeout=180)
        rows = wait_until(f"{key}: five steps in sacct", lambda j=job: _step_names(bridge, j), timeout=60)
        seen[key] = (rows, (workdir / "out").read_text())
    native = seen[("native", 0)]
    assert native[0] == ["0|true", "1|sh", "2|mine", "3|sh", "4|steps.conf"], native
    assert native[1] == "named: mine\nunnamed: named.sh\nmulti\n", native
    assert all(case == native for case in seen.values()), seen


def _step_names(sandbox: Sandbox, job: int) -> list[str] | None:
    out = sandbox.slurm("sacct", "-n", "-P", "-j", str(job), "-o", "JobID,JobName", check=False).stdout
    rows = [line.split(".", 1)[1] for line in out.split() if re.match(rf"{job}\.\d+\|", line)]
    return sorted(rows) if len(rows) == 5 else None
