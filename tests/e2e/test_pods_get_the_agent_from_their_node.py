"""Issue 22, a pod that starts once: the sandbox's job pods mount the agent that
containers/images/agent.sh installed on the real nodes ([pods] agent_host_dir) and have no init
container. Jobs at once run as natively (and with the init container, which stays supported:
test_pods_get_the_agent_from_an_init_container.py); a script cannot change the node's agent; a node
without it fails the job with the kubelet's reason, in the job's output."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path
from typing import Any

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
    "(mv /slurm-k8s-bridge-bin/slurm-k8s-bridge-agent /slurm-k8s-bridge-bin/moved) 2>/dev/null"
    " && echo own-copy-moved\n"
    "echo done\n"
)


def _restart_bridge(**env: str) -> None:
    subprocess.run([str(BRIDGE_UP.with_name("down.sh"))], check=True, capture_output=True)
    subprocess.run([str(BRIDGE_UP)], check=True, capture_output=True, env={**os.environ, **env})


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


def run_four_as_natively(bridge: Sandbox) -> None:
    native = _run_four(bridge, "native")
    bridged = _run_four(bridge, "k8s")
    assert bridged == native
    assert native[3] == ("FAILED", "3:0", "out 3\nstep 0 of 1\n", "err 3\n")


def a_pods_spec(bridge: Sandbox) -> dict[str, Any]:
    """The spec of a running job's pod."""
    script = write_script(bridge, "alice", "agent-from-pod.sh", BUSYBOX + "sleep 30\n")
    job_id = bridge.sbatch("-p", "k8s", "-o", "/dev/null", str(script))
    try:
        (pod,) = wait_until(f"job {job_id}'s pod", lambda: job_pods(bridge, job_id) or None, timeout=60)
        return dict(pod["spec"])
    finally:
        bridge.slurm("scancel", str(job_id))


@pytest.mark.shares_the_cluster
def test_jobs_at_once_run_as_natively_with_the_nodes_agent(bridge: Sandbox) -> None:
    run_four_as_natively(bridge)


@pytest.mark.shares_the_cluster
def test_the_pod_has_no_init_container_and_mounts_the_nodes_agent(bridge: Sandbox) -> None:
    spec = a_pods_spec(bridge)
    assert "initContainers" not in spec
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    assert volumes["slurm-k8s-bridge-agent-node"]["hostPath"] == {"path": str(NODE_AGENT.parent),
                                                                  "type": "Directory"}


@pytest.mark.shares_the_cluster
def test_a_script_cannot_change_the_nodes_agent(bridge: Sandbox) -> None:
    before = hashlib.sha256(NODE_AGENT.read_bytes()).hexdigest()
    script = write_script(bridge, "alice", "agent-from-hostile.sh", HOSTILE)
    jobs = [bridge.sbatch("-p", "k8s", "-w", node, "-o", f"agent-hostile-{node}-%j.out", str(script))
            for node in ("kreal1", "kreal2")]
    for job_id, node in zip(jobs, ("kreal1", "kreal2"), strict=True):
        row = bridge.wait_job_final(job_id, timeout=120)
        out = (bridge.home("alice") / f"agent-hostile-{node}-{job_id}.out").read_text()
        assert row["State"] == "COMPLETED", (row, out, job_trail(job_id))
        assert out == "own-copy-moved\ndone\n", out
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
