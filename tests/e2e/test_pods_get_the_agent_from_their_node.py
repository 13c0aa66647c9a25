"""Issue 22, a pod that starts once: the sandbox's job pods mount the agent that
containers/images/agent.sh installed on the real nodes ([pods] agent_host_dir) and have no init
container. Jobs at once run as natively either way (the init container's way too, which stays
supported); a script cannot change the node's agent; a node without it fails the job with the
kubelet's reason, in the job's output."""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.sandbox import BRIDGE_UP, Sandbox, job_pods, job_trail, wait_until, write_script

pytestmark = pytest.mark.e2e

NODE_AGENT = Path("/var/lib/slurm-k8s-sandbox/agent-node/current/slurm-k8s-bridge-agent")
BUSYBOX = "#!/bin/sh\n#K8S image=sandbox.local/busybox:1\n"
JOB = BUSYBOX + (
    'echo "out $1"\necho "err $1" >&2\n'
    "srun -n1 sh -c 'echo \"step $SLURM_STEP_ID of $SLURM_NTASKS\"'\n"
    "exit $1\n"
)
HOSTILE = BUSYBOX + (
    "cd /slurm-k8s-bridge-node || exit 9\n"
    "(echo planted > slurm-k8s-bridge-agent) 2>/dev/null && echo WROTE-THE-NODES-AGENT\n"
    "(cp /bin/sh ./sh) 2>/dev/null && echo ADDED-TO-THE-NODES-DIRECTORY\n"
    # Its own copy is its own pod's business (as with the init container): it may break only itself.
    "echo replaced > /slurm-k8s-bridge-bin/slurm-k8s-bridge-agent && echo own-copy-replaced\n"
    "echo done\n"
)


def _restart_bridge(**env: str) -> None:
    subprocess.run([str(BRIDGE_UP.with_name("down.sh"))], check=True, capture_output=True)
    subprocess.run([str(BRIDGE_UP)], check=True, capture_output=True, env={**os.environ, **env})


@pytest.fixture(scope="module", params=["node", "init"])
def agent_from(request: pytest.FixtureRequest, bridge: Sandbox) -> Iterator[str]:
    """The bridge as the sandbox runs it (the agent from the node), then with the init container."""
    if request.param == "init":
        _restart_bridge(SBX_AGENT_FROM="init")
    try:
        yield str(request.param)
    finally:
        if request.param == "init":
            _restart_bridge()


def _run_four(bridge: Sandbox, partition: str) -> dict[int, tuple[str, str, str, str]]:
    """Four jobs at once, exiting 0..3: (State, ExitCode, -o bytes, -e bytes) of each."""
    script = write_script(bridge, "alice", f"agent-from-{partition}.sh", JOB)
    jobs = {}
    for code in range(4):
        out, err = (bridge.home("alice") / f"agent-from-{partition}-{code}.{ext}" for ext in ("out", "err"))
        out.unlink(missing_ok=True)
        err.unlink(missing_ok=True)
        jobs[code] = (bridge.sbatch("-p", partition, "-o", str(out), "-e", str(err), str(script), str(code)),
                      out, err)
    results = {}
    for code, (job_id, out, err) in jobs.items():
        row = bridge.wait_job_final(job_id, timeout=180)
        results[code] = (row["State"], row["ExitCode"], out.read_text(), err.read_text())
    return results


def test_jobs_at_once_run_as_natively_whichever_way_the_agent_came(bridge: Sandbox, agent_from: str) -> None:
    native = _run_four(bridge, "native")
    bridged = _run_four(bridge, "k8s")
    assert bridged == native
    assert native[3] == ("FAILED", "3:0", "out 3\nstep 0 of 1\n", "err 3\n")


def test_the_pod_has_an_init_container_only_without_the_nodes_agent(bridge: Sandbox, agent_from: str) -> None:
    script = write_script(bridge, "alice", "agent-from-pod.sh", BUSYBOX + "sleep 30\n")
    job_id = bridge.sbatch("-p", "k8s", "-o", "/dev/null", str(script))
    try:
        (pod,) = wait_until(f"job {job_id}'s pod", lambda: job_pods(bridge, job_id) or None, timeout=60)
        volumes = {volume["name"]: volume for volume in pod["spec"]["volumes"]}
        if agent_from == "node":
            assert "initContainers" not in pod["spec"]
            assert volumes["slurm-k8s-bridge-agent-node"]["hostPath"] == {
                "path": str(NODE_AGENT.parent), "type": "Directory"}
        else:
            assert [c["name"] for c in pod["spec"]["initContainers"]] == ["slurm-k8s-bridge-agent"]
            assert "slurm-k8s-bridge-agent-node" not in volumes
    finally:
        bridge.slurm("scancel", str(job_id))


def test_a_script_cannot_change_the_nodes_agent(bridge: Sandbox) -> None:
    before = hashlib.sha256(NODE_AGENT.read_bytes()).hexdigest()
    script = write_script(bridge, "alice", "agent-from-hostile.sh", HOSTILE)
    jobs = [bridge.sbatch("-p", "k8s", "-w", node, "-o", f"agent-hostile-{node}-%j.out", str(script))
            for node in ("kreal1", "kreal2")]
    for job_id, node in zip(jobs, ("kreal1", "kreal2"), strict=True):
        row = bridge.wait_job_final(job_id, timeout=120)
        out = (bridge.home("alice") / f"agent-hostile-{node}-{job_id}.out").read_text()
        assert row["State"] == "COMPLETED", (row, out, job_trail(job_id))
        assert out == "own-copy-replaced\ndone\n", out
    assert hashlib.sha256(NODE_AGENT.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in NODE_AGENT.parent.iterdir()) == ["slurm-k8s-bridge-agent"]


def test_a_node_without_the_agent_fails_the_job_with_the_kubelets_reason(bridge: Sandbox) -> None:
    _restart_bridge(SBX_AGENT_HOST_DIR="/var/lib/slurm-k8s-sandbox/agent-node/no-such-version")
    try:
        script = write_script(bridge, "alice", "agent-missing.sh", BUSYBOX + "echo never\n")
        jobs = [bridge.sbatch("-p", "k8s", "-o", "agent-missing-%j.out", str(script)) for _ in range(2)]
        rows = {job_id: bridge.wait_job_final(job_id, timeout=120) for job_id in jobs}
    finally:
        _restart_bridge()
    for job_id, row in rows.items():
        out = (bridge.home("alice") / f"agent-missing-{job_id}.out").read_text()
        assert (row["State"], row["ExitCode"]) == ("FAILED", "1:0"), (row, out)
        assert "FailedMount" in out and "no-such-version" in out and "never" not in out, out
