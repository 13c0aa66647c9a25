"""sbatch to a bridged partition runs the script in pods pinned to Slurm's choice; Slurm's
accounting ends up exactly as if the job had run natively (the `native` partition is the reference)."""

from __future__ import annotations

import time

import pytest

from tests.e2e.sandbox import Sandbox, job_pods, wait_until, write_script

BUSYBOX = "#K8S image=sandbox.local/busybox:1\n"


def _script(body: str) -> str:
    return "#!/bin/sh\n" + BUSYBOX + body


def _pods_while_running(bridge: Sandbox, job_id: int, count: int = 1) -> list[dict]:
    def running() -> list[dict] | None:
        pods = job_pods(bridge, job_id)
        started = [p for p in pods if p["status"].get("phase") in ("Running", "Succeeded", "Failed")]
        return pods if len(started) >= count else None

    return wait_until(f"{count} running pod(s) of job {job_id}", running, timeout=60)


@pytest.mark.shares_the_cluster
def test_exit_code_output_node_and_identity_of_a_failing_job(bridge: Sandbox) -> None:
    script = write_script(bridge, "alice", "k8s-exit3.sh", _script(
        'echo "host=$(hostname) ids=$(id -u):$(id -g)"\n'
        'echo "gpus=$SLURM_JOB_GPUS nvidia=$NVIDIA_VISIBLE_DEVICES node=$SLURMD_NODENAME"\n'
        "sleep 2\nexit 3\n"
    ))
    job_id = bridge.sbatch("-p", "k8s", "--gres=gpu:1", str(script))

    pod = _pods_while_running(bridge, job_id)[0]
    gpus = bridge.slurm("scontrol", "show", "job", str(job_id), "-d").stdout  # while it runs
    row = bridge.wait_job_final(job_id)

    assert (row["State"], row["ExitCode"]) == ("FAILED", "3:0")
    assert pod["spec"]["nodeName"] == row["NodeList"], "the pod ran on the node Slurm allocated"
    identity = pod["spec"]["securityContext"]
    assert (identity["runAsUser"], identity["runAsGroup"], identity["runAsNonRoot"]) == (2001, 2001, True)
    security = pod["spec"]["containers"][0]["securityContext"]
    assert (security["allowPrivilegeEscalation"], security["privileged"]) == (False, False)
    assert security["capabilities"]["drop"] == ["ALL"]
    out = (bridge.home("alice") / f"slurm-{job_id}.out").read_text().splitlines()
    assert out[0] == f"host={row['NodeList']} ids=2001:2001"
    index = out[1].split()[0].removeprefix("gpus=")
    assert f"IDX:{index}" in gpus, "the pod saw the GPU index Slurm allocated"
    assert out[1] == f"gpus={index} nvidia={index} node={row['NodeList']}"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("echo fine\nexit 0\n", ("COMPLETED", "0:0")),
        ("echo dying\nkill -9 $$\n", None),  # None: whatever native Slurm records
        ("exit 42\n", ("FAILED", "42:0")),
    ],
    ids=["exit-0", "sigkill", "exit-42"],
)
@pytest.mark.shares_the_cluster
def test_accounting_matches_native_slurm(
    bridge: Sandbox, body: str, expected: tuple[str, str] | None
) -> None:
    script = write_script(bridge, "bob", f"same-{abs(hash(body))}.sh", _script(body))
    native = bridge.sbatch("-p", "native", str(script), user="bob")
    bridged = bridge.sbatch("-p", "k8s", str(script), user="bob")

    native_row = bridge.wait_job_final(native)
    bridged_row = bridge.wait_job_final(bridged)

    assert (bridged_row["State"], bridged_row["ExitCode"]) == (native_row["State"], native_row["ExitCode"])
    if expected is not None:
        assert (bridged_row["State"], bridged_row["ExitCode"]) == expected
    else:
        assert bridged_row["ExitCode"].endswith(":9"), "killed by SIGKILL shows signal 9"
    native_out = (bridge.home("bob") / f"slurm-{native}.out").read_text()
    bridged_out = (bridge.home("bob") / f"slurm-{bridged}.out").read_text()
    assert native_out.splitlines()[:1] == bridged_out.splitlines()[:1]


def test_gpu_indices_follow_slurm_when_another_job_holds_the_first_gpus(bridge: Sandbox) -> None:
    holder = write_script(bridge, "alice", "gpu-holder.sh", _script("sleep 30\n"))
    probe = write_script(bridge, "bob", "gpu-probe.sh", _script(
        'echo "slurm=$SLURM_JOB_GPUS nvidia=$NVIDIA_VISIBLE_DEVICES"\n'
    ))
    first = bridge.sbatch("-p", "k8s", "-w", "kreal1", "--gres=gpu:2", str(holder))
    _pods_while_running(bridge, first)
    second = bridge.sbatch("-p", "k8s", "-w", "kreal1", "--gres=gpu:2", str(probe), user="bob")

    row = bridge.wait_job_final(second)
    bridge.slurm("scancel", str(first))

    assert row["State"] == "COMPLETED"
    assert (bridge.home("bob") / f"slurm-{second}.out").read_text() == "slurm=2,3 nvidia=2,3\n"


@pytest.mark.shares_the_cluster
def test_two_node_job_gets_a_pod_per_node_runs_its_script_once_and_srun_gives_the_highest_exit_code(
    bridge: Sandbox,
) -> None:
    script = write_script(bridge, "alice", "two-nodes.sh", _script(
        'echo "script on $SLURMD_NODENAME of $SLURM_NNODES list=$SLURM_JOB_NODELIST"\n'
        # Rank 0 fails first with the lower code: srun still waits for rank 1's higher one.
        "srun sh -c 'echo rank=$SLURM_NODEID on $SLURMD_NODENAME; sleep $((1 + 2 * SLURM_NODEID)); "
        "exit $((SLURM_NODEID == 0 ? 2 : 5))'\nexit $?\n"
    ))
    job_id = bridge.sbatch("-p", "k8s", "-N", "2", str(script))

    pods = _pods_while_running(bridge, job_id, count=2)
    row = bridge.wait_job_final(job_id)

    assert sorted(p["spec"]["nodeName"] for p in pods) == ["kreal1", "kreal2"]
    assert (row["State"], row["ExitCode"]) == ("FAILED", "5:0")
    lines = sorted((bridge.home("alice") / f"slurm-{job_id}.out").read_text().splitlines())
    assert lines == [
        "rank=0 on kreal1",
        "rank=1 on kreal2",
        "script on kreal1 of 2 list=kreal[1-2]",
        "srun: error: kreal1: task 0: Exited with exit code 2",
        "srun: error: kreal2: task 1: Exited with exit code 5",
    ]


@pytest.mark.shares_the_cluster
def test_scancel_removes_the_pods(bridge: Sandbox) -> None:
    """How fast is printed (about 1 s here; `make bench` measures it), never asserted: on these
    shared machines a timed assertion fails for the machine's sake (seen: 2.0 s once)."""
    script = write_script(bridge, "alice", "sleeper.sh", _script("echo started\nsleep 300\n"))
    job_id = bridge.sbatch("-p", "k8s", str(script))
    _pods_while_running(bridge, job_id)

    cancelled_at = time.monotonic()
    bridge.slurm("scancel", str(job_id), user="alice")
    gone_after = None
    while gone_after is None and time.monotonic() - cancelled_at < 30:
        asked_at = time.monotonic()  # the API server answers for about this moment
        if not job_pods(bridge, job_id):
            gone_after = asked_at - cancelled_at

    assert gone_after is not None, "pods were still there 30 s after scancel"
    print(f"\npods gone {gone_after:.2f}s after scancel")
    assert bridge.wait_job_final(job_id)["State"] == "CANCELLED by 2001"


@pytest.mark.shares_the_cluster
def test_time_limit_ends_the_job_as_timeout_and_removes_the_pods(bridge: Sandbox) -> None:
    script = write_script(bridge, "bob", "overtime.sh", _script("echo started\nsleep 600\n"))
    job_id = bridge.sbatch("-p", "k8s", "--time=1", str(script), user="bob")
    _pods_while_running(bridge, job_id)

    row = bridge.wait_job_final(job_id, timeout=150)

    assert row["State"] == "TIMEOUT"
    wait_until("the pods to be gone", lambda: not job_pods(bridge, job_id), timeout=15)


@pytest.mark.shares_the_cluster
def test_a_job_without_image_is_refused_at_submit_with_the_reason(bridge: Sandbox) -> None:
    """In a partition without a default image (the sandbox's dra; k8s has one)."""
    script = write_script(bridge, "alice", "no-image.sh", "#!/bin/sh\necho never\n")

    result = bridge.slurm("sbatch", "-p", "dra", str(script), user="alice",
                          cwd=str(bridge.home("alice")), check=False)

    assert result.returncode != 0
    assert "no container image" in result.stderr
    assert "#K8S image=" in result.stderr


@pytest.mark.shares_the_cluster
def test_an_image_that_cannot_be_pulled_fails_the_job_with_the_reason_in_its_output(bridge: Sandbox) -> None:
    script = write_script(bridge, "alice", "bad-image.sh",
                          "#!/bin/sh\n#K8S image=sandbox.local/no-such-image:1\necho never\n")
    job_id = bridge.sbatch("-p", "k8s", str(script))

    row = bridge.wait_job_final(job_id, timeout=120)

    assert row["State"] == "FAILED"
    out = (bridge.home("alice") / f"slurm-{job_id}.out").read_text()
    assert "sandbox.local/no-such-image:1" in out
    assert "never" not in out
    comment = bridge.slurm("scontrol", "show", "job", str(job_id)).stdout
    assert "no-such-image" in comment
