"""The PyTorch-on-Slurm idiom (issue 18): MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST"
| head -n1), then every rank meets rank 0 over TCP at that name, as torch.distributed's TCPStore does.
In a bridged job each rank is in its own pod: the first pod is that host, and the others resolve
the name to the first pod's address. Several such jobs at once.

k8s only: the sandbox's native nodes all listen on 127.0.0.1 under names no resolver knows."""

from __future__ import annotations

import pytest

from tests.e2e.sandbox import Sandbox, job_trail, write_script

pytestmark = [pytest.mark.e2e, pytest.mark.shares_the_cluster]

RENDEZVOUS = r'''import os, socket, time
rank, port = int(os.environ["SLURM_PROCID"]), 29500
master = os.environ["MASTER_ADDR"]
if rank == 0:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("", port))
    server.listen(8)
    server.settimeout(120)
    for _ in range(int(os.environ["SLURM_NTASKS"]) - 1):
        peer, _ = server.accept()
        peer.sendall(("hello from rank 0 on " + socket.gethostname()).encode())
        peer.close()
    print("rank 0 served its peers")
else:
    deadline = time.time() + 120
    while True:
        try:
            connection = socket.create_connection((master, port), timeout=5)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.3)
    print("rank", rank, "got:", connection.recv(100).decode())
'''

SCRIPT = """#!/bin/sh
#K8S image=sandbox.local/debian-python:12
first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
echo "first node $first, MASTER_ADDR ${{MASTER_ADDR-unset}}, RANK ${{RANK-unset}}"
export MASTER_ADDR=$first
srun -l python3 {path} | sort
"""


def _run(bridge: Sandbox, copies: int) -> None:
    program = write_script(bridge, "alice", "rendezvous.py", RENDEZVOUS)
    script = write_script(bridge, "alice", "rendezvous.sh", SCRIPT.format(path=program))
    jobs = []
    for copy in range(copies):
        out = bridge.home("alice") / f"rendezvous-{copy}.out"
        out.unlink(missing_ok=True)
        jobs.append((bridge.sbatch("-p", "k8s", "-N2", "-n2", "-o", str(out), str(script)), out))
    for job_id, out in jobs:
        row = bridge.wait_job_final(job_id, timeout=240)
        text = out.read_text(errors="replace")
        assert (row["State"], row["ExitCode"]) == ("COMPLETED", "0:0"), f"{row}\n{text}\n{job_trail(job_id)}"
        first = row["NodeList"].replace("kreal[1-2]", "kreal1").split(",")[0]
        assert text == (
            f"first node {first}, MASTER_ADDR unset, RANK unset\n"
            "0: rank 0 served its peers\n"
            f"1: rank 1 got: hello from rank 0 on {first}\n"
        ), f"{text}\n{job_trail(job_id)}"


def test_ranks_meet_rank_0_at_the_first_nodes_name(bridge: Sandbox) -> None:
    _run(bridge, 1)


def test_several_jobs_meet_their_own_rank_0_at_once(bridge: Sandbox) -> None:
    _run(bridge, 3)
