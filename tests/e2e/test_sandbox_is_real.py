"""Smoke tests proving each part of the sandbox is a real daemon doing real work."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.e2e.sandbox import Sandbox, wait_until


@pytest.mark.shares_the_cluster
def test_native_batch_job_exit_code_reaches_sacct(sandbox: Sandbox) -> None:
    job_id = sandbox.sbatch("-p", "native", "--wrap", "echo native-out; exit 3", user="alice")

    row = sandbox.wait_job_final(job_id)

    assert (row["State"], row["ExitCode"]) == ("FAILED", "3:0")
    assert (row["User"], row["Account"]) == ("alice", "lab_alice")
    out = sandbox.home("alice") / f"slurm-{job_id}.out"
    assert out.read_text() == "native-out\n"  # written by slurmd in the rootfs, read on the host


@pytest.mark.shares_the_cluster
def test_each_test_user_has_an_account_of_its_own(sandbox: Sandbox) -> None:
    out = sandbox.slurm("sacctmgr", "-n", "-P", "show", "assoc", "format=user,account").stdout
    pairs = {tuple(line.split("|")) for line in out.splitlines() if line.split("|")[0] in ("alice", "bob")}

    assert pairs == {("alice", "lab_alice"), ("bob", "lab_bob")}


def test_native_job_sees_the_gpu_indices_slurm_chose(sandbox: Sandbox) -> None:
    job_id = sandbox.sbatch(
        "-p", "native", "--gres=gpu:2", "--wrap", 'echo "gpus=$CUDA_VISIBLE_DEVICES"', user="bob"
    )

    assert sandbox.wait_job_final(job_id)["State"] == "COMPLETED"
    assert (sandbox.home("bob") / f"slurm-{job_id}.out").read_text() == "gpus=0,1\n"


@pytest.mark.shares_the_cluster
def test_every_partition_node_has_four_fake_gpus(sandbox: Sandbox) -> None:
    out = sandbox.slurm("sinfo", "-h", "-N", "-o", "%N %P %G").stdout
    rows = [line.split() for line in out.splitlines()]

    partitions = {partition.rstrip("*") for _, partition, _ in rows}
    assert partitions == {"native", "urgent", "k8s", "sim", "dra", "simdra"}
    assert {gres for _, _, gres in rows} == {"gpu:4"}


@pytest.mark.shares_the_cluster
def test_slurmrestd_accepts_a_jwt_and_lists_jobs(sandbox: Sandbox) -> None:
    request = urllib.request.Request(
        f"{sandbox.rest_url}/slurm/v0.0.45/jobs/",
        headers={"X-SLURM-USER-NAME": "alice", "X-SLURM-USER-TOKEN": sandbox.token("alice", 300)},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        body = json.load(response)

    assert response.status == 200
    assert isinstance(body["jobs"], list)
    assert body["errors"] == []


@pytest.mark.shares_the_cluster
def test_slurmrestd_rejects_a_forged_token(sandbox: Sandbox) -> None:
    request = urllib.request.Request(
        f"{sandbox.rest_url}/slurm/v0.0.45/jobs/",
        headers={"X-SLURM-USER-NAME": "alice", "X-SLURM-USER-TOKEN": "not-a-token"},
    )
    try:
        urllib.request.urlopen(request, timeout=10)
    except urllib.error.HTTPError as error:
        assert error.code in (401, 403, 511)  # slurmrestd 26.05 answers 511
    else:
        raise AssertionError("slurmrestd accepted a forged token")


@pytest.mark.shares_the_cluster
def test_kubernetes_lists_real_and_simulated_nodes_ready(sandbox: Sandbox) -> None:
    nodes = sandbox.kubectl_json("get", "nodes")["items"]
    ready = {
        n["metadata"]["name"]: n["metadata"]["labels"].get("type")
        for n in nodes
        if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])
    }

    assert "real" in ready.values()
    assert list(ready.values()).count("kwok") >= 16
    slurm_nodes = sandbox.slurm("sinfo", "-h", "-p", "k8s,sim", "-N", "-o", "%N").stdout.split()
    assert set(slurm_nodes) <= set(ready), "every bridged Slurm node has a Ready Kubernetes twin"


def _pod_on_real_node(sandbox: Sandbox, name: str, command: str, uid: int | None = None) -> dict:
    real = next(
        n["metadata"]["name"]
        for n in sandbox.kubectl_json("get", "nodes", "-l", "type=real")["items"]
    )
    security = {"runAsUser": uid, "runAsGroup": uid, "runAsNonRoot": True} if uid else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": real,
            "restartPolicy": "Never",
            "tolerations": [{"key": "slurm-k8s-bridge/bridged", "operator": "Exists"}],
            "securityContext": security,
            "containers": [
                {
                    "name": "main",
                    "image": "sandbox.local/busybox:1",
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", command],
                    "volumeMounts": [{"name": "home", "mountPath": "/home"}],
                }
            ],
            "volumes": [{"name": "home", "hostPath": {"path": "/home", "type": "Directory"}}],
        },
    }


def _run_pod(sandbox: Sandbox, manifest: dict) -> dict:
    name = manifest["metadata"]["name"]
    sandbox.kubectl_create(manifest)

    def finished() -> dict | None:
        pod = sandbox.kubectl_json("get", "pod", name)
        return pod if pod["status"].get("phase") in ("Succeeded", "Failed") else None

    return wait_until(f"pod {name} to finish", finished, timeout=90)


@pytest.mark.shares_the_cluster
def test_real_node_runs_a_container_and_reports_its_exit_code_and_log(sandbox: Sandbox) -> None:
    name = f"smoke-{uuid.uuid4().hex[:8]}"
    pod = _run_pod(sandbox, _pod_on_real_node(sandbox, name, "echo hi; exit 7"))

    state = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert pod["status"]["phase"] == "Failed"
    assert state["exitCode"] == 7
    assert sandbox.kubectl("logs", name).stdout == "hi\n"
    sandbox.kubectl("delete", "pod", name, "--wait=false")


@pytest.mark.shares_the_cluster
def test_real_node_runs_as_a_test_user_and_sees_the_shared_home(sandbox: Sandbox) -> None:
    name = f"smoke-{uuid.uuid4().hex[:8]}"
    marker = sandbox.home("alice") / f"{name}.txt"
    command = f"id -u; id -g; echo from-pod > {marker}"
    pod = _run_pod(sandbox, _pod_on_real_node(sandbox, name, command, uid=2001))

    assert pod["status"]["phase"] == "Succeeded"
    assert sandbox.kubectl("logs", name).stdout.split() == ["2001", "2001"]
    assert marker.read_text() == "from-pod\n"
    assert marker.stat().st_uid == 2001
    marker.unlink()
    sandbox.kubectl("delete", "pod", name, "--wait=false")


@pytest.mark.shares_the_cluster
def test_pods_reach_the_api_server_and_slurmrestd_through_the_service_network(sandbox: Sandbox) -> None:
    # A bridge replica in a pod talks to both: the API server through the "kubernetes"
    # Service (kube-proxy), slurmrestd at the host's control address.
    name = f"smoke-{uuid.uuid4().hex[:8]}"
    token = sandbox.token("alice", 300)
    command = (
        "wget -qO- --no-check-certificate https://10.96.0.1/healthz; echo;"
        f" wget -qO- --header 'X-SLURM-USER-NAME: alice' --header 'X-SLURM-USER-TOKEN: {token}'"
        f" http://{sandbox.control_ip}:6820/slurm/v0.0.45/ping/"
    )
    pod = _run_pod(sandbox, _pod_on_real_node(sandbox, name, command))

    log = sandbox.kubectl("logs", name).stdout
    assert pod["status"]["phase"] == "Succeeded", log
    first, _, rest = log.partition("\n")
    assert first == "ok"
    assert json.loads(rest)["pings"][0]["responding"] is True
    sandbox.kubectl("delete", "pod", name, "--wait=false")


@pytest.mark.shares_the_cluster
def test_the_host_reaches_a_service_by_its_cluster_ip(sandbox: Sandbox) -> None:
    # The slurmds' waiters reach the bridge Deployment this way.
    name = f"smoke-{uuid.uuid4().hex[:8]}"
    manifest = _pod_on_real_node(
        sandbox, name, f"mkdir /www && echo {name} >/www/index.html && exec httpd -f -p 8080 -h /www"
    )
    manifest["metadata"]["labels"] = {"smoke": name}
    manifest["spec"]["containers"][0]["readinessProbe"] = {"tcpSocket": {"port": 8080}, "periodSeconds": 1}
    sandbox.kubectl_create(manifest)
    sandbox.kubectl_create(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"selector": {"smoke": name}, "ports": [{"port": 80, "targetPort": 8080}]},
        }
    )
    cluster_ip = sandbox.kubectl_json("get", "service", name)["spec"]["clusterIP"]

    def served() -> str | None:
        try:
            with urllib.request.urlopen(f"http://{cluster_ip}/", timeout=2) as response:
                return response.read().decode()
        except OSError:
            return None

    try:
        assert wait_until(f"{name} at {cluster_ip}", served, timeout=60) == f"{name}\n"
    finally:
        sandbox.kubectl("delete", "service,pod", name, "--wait=false", check=False)


@pytest.mark.shares_the_cluster
def test_the_bridged_partitions_come_from_deploy_slurm(sandbox: Sandbox) -> None:
    # One source of truth: what operators copy (deploy/slurm) is what the sandbox runs.
    repo = Path(__file__).resolve().parents[2]
    etc = Path(sandbox.env["SLURM_CONF"]).parents[1]
    # Nodes of k8s and sim; partitions k8s, sim, and dra and simdra over the same nodes.
    expected = (("slurm.conf.bridged", "slurm.conf", {"NodeName": 2, "PartitionName": 4}),
                ("gres.conf.bridged", "gres.conf", {"NodeName": 1}))
    for snippet, rendered, times in expected:
        lines = [x for x in (etc / rendered).read_text().splitlines() if "native" not in x]
        for template in (repo / "deploy" / "slurm" / snippet).read_text().splitlines():
            if not template or template.startswith("#"):
                continue
            # A partition may add options of its own (dra's PriorityTier, for suspend preemption).
            rendered_line = re.sub(r"@[A-Z_]+@", "[^ ]+", re.escape(template))
            pattern = re.compile("^" + rendered_line + "( [A-Za-z]+=[^ ]+)*$")
            count = times[template.split("=", 1)[0]]
            assert sum(bool(pattern.match(line)) for line in lines) == count, (snippet, template)
    assert (etc / "job_submit.lua").read_text() == (repo / "deploy" / "slurm" / "job_submit.lua").read_text()


PROBE_HOST = """#!/bin/bash
# Connects to the host's slurmrestd twice a second; one line per try.
for i in $(seq 60); do
  if timeout 1 bash -c 'exec 3<>/dev/tcp/{ip}/6820' 2>/dev/null; then r=ok; else r=FAIL; fi
  echo "$(date +%s.%N) $r"
  sleep 0.5
done
"""


@pytest.mark.shares_the_cluster
def test_a_pods_network_survives_the_end_of_pods_beside_it(bridge: Sandbox) -> None:
    """Jobs ending on a node leave the other pods there their network: the node's CNI bridge (the
    pods' gateway) keeps its address. A bridge without one took its ports' lowest, which changed
    when that pod went, and the others sent to a gone address for ~45 s (a dask worker lost its
    scheduler when a job beside it was cancelled). Four pods go while one probes the host."""
    others = [bridge.sbatch("-p", "k8s", "-w", "kreal1", "--wrap", "sleep 300") for _ in range(4)]
    directory = bridge.home("alice")
    script = directory / "probe-host.sh"
    script.write_text(PROBE_HOST.replace("{ip}", bridge.control_ip))
    script.chmod(0o755)
    prober = bridge.sbatch("-p", "k8s", "-w", "kreal1", "-o", f"{directory}/probe-%j.out", str(script))
    out = directory / f"probe-{prober}.out"
    try:
        for job_id in [*others, prober]:
            wait_until(f"job {job_id} running", lambda j=job_id: bridge.slurm(
                "squeue", "-h", "-j", str(j), "-o", "%T").stdout.strip() == "RUNNING" or None, timeout=120)
        wait_until("the probe connecting", lambda: (out.exists() and " ok" in out.read_text()) or None,
                   timeout=60)
        bridge.slurm("scancel", *map(str, others))
        row = bridge.wait_job_final(prober, timeout=120)
    finally:
        bridge.slurm("scancel", *map(str, [*others, prober]), check=False)
    assert row["State"] == "COMPLETED" and len(out.read_text().splitlines()) == 60, (row, out.read_text())
    failed = [line for line in out.read_text().splitlines() if line.endswith("FAIL")]
    assert not failed, f"the probe lost the host after its neighbours ended: {failed}"
