"""GPUs of Kubernetes workloads scheduled by Slurm (issue 20), on the real kubelets with the sandbox's
real DRA driver (mock GPUs gpu-0..gpu-3 per node, injected by CDI as GPU_DEVICE_<n>=gpu-<n>): alice's
pods ask for GPUs by a claim made from her ResourceClaimTemplate, Slurm chooses the GPUs, and each
pod's claim holds exactly those. An sbatch job and a pod share a node, each with its own GPUs.

What a pod may touch is read from the ResourceClaims the API server holds (the sampler of
test_gpus_by_dra: no device is ever held by two live claims), and from what the pod's runtime
injected (its log)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.sandbox import Sandbox, job_trail, wait_until, write_script
from tests.e2e.test_gpus_by_dra import ClaimSampler
from tests.e2e.test_kubernetes_workloads import (
    NS,
    as_alice,
    bare_pod,
    batch_job,
    create,
    events,
    final,
    pod,
    pods_of,
    slurm_job_of,
)
from tests.e2e.test_kubernetes_workloads import tag as named_objects

pytestmark = pytest.mark.e2e
tag = named_objects  # the fixture: this test's objects' name prefix, all removed afterwards

SHOW = 'env | sed -n "s/^GPU_DEVICE_\\([0-9]*\\)=gpu-[0-9]*$/cdi \\1/p" | sort; sleep {hold}'
"""What a pod prints: the index of each device the runtime injected, one line each."""
SBATCH_SHOW = """#!/bin/sh
#K8S image=sandbox.local/busybox:1
echo "job $SLURM_JOB_GPUS"
env | sed -n 's/^GPU_DEVICE_\\([0-9]*\\)=gpu-[0-9]*$/cdi \\1/p' | sort
sleep "${HOLD:-2}"
"""


def template(name: str, count: int) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com", "count": count}}]}}}}


def with_gpus(manifest: dict[str, Any], claim_template: str) -> dict[str, Any]:
    """`manifest` (a Pod or a Job) in partition dra, its pods asking for GPUs by `claim_template`."""
    meta, spec = ((manifest["spec"]["template"]["metadata"], manifest["spec"]["template"]["spec"])
                  if manifest["kind"] == "Job" else (manifest["metadata"], manifest["spec"]))
    meta.setdefault("annotations", {})["slurm-k8s-bridge/partition"] = "dra"
    spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": claim_template}]
    for container in spec["containers"]:
        container["resources"]["claims"] = [{"name": "gpu"}]
    return manifest


def injected(sandbox: Sandbox, name: str) -> list[int]:
    log = sandbox.kubectl("logs", "-n", NS, name, check=False).stdout
    return sorted(int(i) for i in re.findall(r"^cdi (\d+)$", log, re.M))


def sbatch_gpus(sandbox: Sandbox, name: str, *options: str, hold: int, user: str = "bob") -> tuple[int, Path]:
    script = write_script(sandbox, user, "dra-workload-show.sh", SBATCH_SHOW)
    out = sandbox.home(user) / f"{name}-%j.out"
    job_id = sandbox.sbatch("-p", "dra", *options, f"--export=ALL,HOLD={hold}", "-o", str(out), str(script),
                            user=user)
    return job_id, Path(str(out).replace("%j", str(job_id)))


def running(sandbox: Sandbox, job_id: int) -> bool:
    state = sandbox.slurm("squeue", "-h", "-j", str(job_id), "-o", "%T", check=False).stdout.strip()
    return state == "RUNNING"


def test_a_gpu_job_waits_behind_sbatchs_gpus_and_starts_as_one_gang_under_alices_account(
        bridge: Sandbox, tag: str) -> None:
    """bob's sbatch job holds every GPU of both real nodes: alice's Job (2 pods, 1 GPU each) waits in
    Slurm's queue, unbound. Once bob's job ends, both pods start in ONE Slurm job of alice's in
    lab_alice with gres/gpu=2; each pod sees exactly the one device its claim holds, none shared;
    the pod that exits 3 makes the job FAILED 3:0."""
    blocker, _ = sbatch_gpus(bridge, f"{tag}-all", "-N2", "--gres=gpu:4", hold=20)
    wait_until("bob's GPU job to run", lambda: running(bridge, blocker), timeout=60)
    create(bridge, template(f"{tag}-one", 1),
           with_gpus(batch_job(f"{tag}-train", 2, SHOW.format(hold=3) + '; [ "$JOB_COMPLETION_INDEX" = 1 ] '
                                                   "&& exit 3; exit 0"), f"{tag}-one"))
    with ClaimSampler(bridge) as sampler:
        pods = wait_until("the Job's pods to wait for Slurm", lambda: (
            found if len(found := pods_of(bridge, f"job-name={tag}-train")) == 2
            and all(map(slurm_job_of, found)) else None), timeout=90)
        job_id = slurm_job_of(pods[0])
        assert job_id is not None and {slurm_job_of(p) for p in pods} == {job_id}
        reasons = wait_until("Slurm's reason on the pods", lambda: (
            said if "pending: Resources" in (said := events(bridge, pods[0]["metadata"]["name"])) else None),
            timeout=60)
        assert f"Slurm job {job_id} pending" in reasons
        assert running(bridge, blocker)
        assert not any(p["spec"].get("nodeName") for p in pods_of(bridge, f"job-name={tag}-train")), \
            "a pod was bound while bob's job held the GPUs"
        row = final(bridge, job_id, timeout=180)
    assert (row["State"], row["ExitCode"]) == ("FAILED", "3:0"), f"{row}\n{job_trail(job_id)}"
    assert (row["User"], row["Account"], row["Partition"]) == ("alice", "lab_alice", "dra"), row
    tres = bridge.slurm("sacct", "-X", "-n", "-P", "-j", str(job_id), "-o", "AllocTRES").stdout
    assert "gres/gpu=2" in tres, tres
    assert not sampler.overlaps, sampler.overlaps[:5]
    seen: list[tuple[str, int]] = []
    for p in pods_of(bridge, f"job-name={tag}-train"):
        devices = injected(bridge, p["metadata"]["name"])
        assert len(devices) == 1, f"{p['metadata']['name']} saw {devices}"
        seen.append((p["spec"]["nodeName"], devices[0]))
        # What the runtime injected is what the pod's own claim held.
        held = {d for key, devices_held in sampler.held_by.items()
                if key.startswith(f"{NS}/{p['metadata']['name']}-gpu-") for _pool, d in devices_held}
        assert held == {f"gpu-{devices[0]}"}, (p["metadata"]["name"], held, devices)
    assert len(set(seen)) == 2, f"two pods got the same GPU: {seen}"


def test_an_sbatch_job_and_a_pod_share_kreal1_each_with_its_own_gpus(bridge: Sandbox, tag: str) -> None:
    """Co-residency: bob's sbatch job holds GPUs 0-1 of kreal1 (and another all of kreal2's), alice's pod
    asks for 2 GPUs: Slurm gives it 2-3 of kreal1, and both run at once, each seeing only its own."""
    first, first_out = sbatch_gpus(bridge, f"{tag}-k1", "-w", "kreal1", "--gres=gpu:2", hold=25)
    other, _ = sbatch_gpus(bridge, f"{tag}-k2", "-w", "kreal2", "--gres=gpu:4", hold=25)
    wait_until("bob's jobs to run", lambda: running(bridge, first) and running(bridge, other), timeout=60)
    create(bridge, template(f"{tag}-two", 2), with_gpus(bare_pod(f"{tag}-beside", SHOW.format(hold=2)),
                                                        f"{tag}-two"))
    with ClaimSampler(bridge) as sampler:
        started = wait_until("alice's pod to run beside bob's job", lambda: (
            p if (p := pod(bridge, f"{tag}-beside")) and p["status"].get("phase") in ("Running", "Succeeded")
            else None), timeout=90)
        assert running(bridge, first), "bob's job ended before alice's pod started: they never shared kreal1"
        job_id = slurm_job_of(started)
        assert job_id is not None
        row = final(bridge, job_id, timeout=120)
        bob = bridge.wait_job_final(first, timeout=120)
    assert (row["State"], row["ExitCode"]) == ("COMPLETED", "0:0"), f"{row}\n{job_trail(job_id)}"
    assert (bob["State"], bob["ExitCode"]) == ("COMPLETED", "0:0"), f"{bob}\n{job_trail(first)}"
    assert started["spec"]["nodeName"] == "kreal1"
    bobs = sorted(int(i) for i in re.findall(r"^cdi (\d+)$", first_out.read_text(), re.M))
    alices = injected(bridge, f"{tag}-beside")
    assert bobs == [0, 1] and alices == [2, 3], f"bob saw {bobs}, alice saw {alices}"
    assert not sampler.overlaps, sampler.overlaps[:5]
    alice_claims = {key for key in sampler.held_by if key.startswith(f"{NS}/{tag}-beside-")}
    assert {d for key in alice_claims for _pool, d in sampler.held_by[key]} == {"gpu-2", "gpu-3"}, \
        sampler.held_by


def test_gpu_gangs_and_sbatch_gpu_jobs_at_once_never_share_a_device(bridge: Sandbox, tag: str) -> None:
    """Under load: 6 Jobs of 2 pods with a GPU each from alice and 6 sbatch jobs of 1-2 GPUs from bob,
    all at once on the 8 GPUs of the real nodes. Every job ends COMPLETED, every pod saw exactly one
    device, and no device was ever held by two claims."""
    create(bridge, template(f"{tag}-one", 1),
           *(with_gpus(batch_job(f"{tag}-g{i}", 2, SHOW.format(hold=2)), f"{tag}-one") for i in range(6)))
    sbatch = [sbatch_gpus(bridge, f"{tag}-s{i}", f"--gres=gpu:{1 + i % 2}", hold=2) for i in range(6)]
    with ClaimSampler(bridge) as sampler:
        def every_gangs_job() -> set[int | None] | None:
            jobs = {slurm_job_of(p) for i in range(6) for p in pods_of(bridge, f"job-name={tag}-g{i}")}
            return jobs if len(jobs - {None}) == 6 else None

        gang_jobs = wait_until("every Job's pods to carry their Slurm job", every_gangs_job, timeout=120)
        for job_id in sorted(j for j in gang_jobs if j is not None):
            row = final(bridge, job_id, timeout=300)
            assert (row["State"], row["ExitCode"]) == ("COMPLETED", "0:0"), f"{row}\n{job_trail(job_id)}"
        for job_id, _out in sbatch:
            row = bridge.wait_job_final(job_id, timeout=300)
            assert (row["State"], row["ExitCode"]) == ("COMPLETED", "0:0"), f"{row}\n{job_trail(job_id)}"
    assert not sampler.overlaps, sampler.overlaps[:5]
    for i in range(6):
        for p in pods_of(bridge, f"job-name={tag}-g{i}"):
            assert len(injected(bridge, p["metadata"]["name"])) == 1, p["metadata"]["name"]


def test_a_claim_that_would_reach_beyond_its_pod_is_refused_on_the_pod(bridge: Sandbox, tag: str) -> None:
    """A pod naming a shared ResourceClaim (resourceClaimName), and a template asking for admin access
    (which would reach devices Slurm gave another job), never become jobs; the pods say why."""
    shared = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
              "metadata": {"name": f"{tag}-shared"}, "spec": template("x", 1)["spec"]["spec"]}
    admin = template(f"{tag}-admin", 1)
    admin["spec"]["spec"]["devices"]["requests"][0]["exactly"]["adminAccess"] = True
    created = as_alice(bridge, "create", "-f", "-", stdin=json.dumps(admin))
    refused_by_kubernetes = created.returncode != 0  # admin access needs a namespace label alice lacks
    create(bridge, shared)
    sharing = bare_pod(f"{tag}-sharing", "true")
    with_gpus(sharing, "unused")
    sharing["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": f"{tag}-shared"}]
    create(bridge, sharing)
    if not refused_by_kubernetes:
        create(bridge, with_gpus(bare_pod(f"{tag}-admin", "true"), f"{tag}-admin"))
    said = wait_until("the refusal on the pod", lambda: (
        text if "SlurmRefused" in (text := events(bridge, f"{tag}-sharing")) else None), timeout=60)
    assert "shared ResourceClaim" in said, said
    p = pod(bridge, f"{tag}-sharing")
    assert p is not None and slurm_job_of(p) is None and not p["spec"].get("nodeName"), p
    if not refused_by_kubernetes:
        said = wait_until("the refusal on the admin pod", lambda: (
            text if "SlurmRefused" in (text := events(bridge, f"{tag}-admin")) else None), timeout=60)
        assert "admin access" in said, said
    bridge.kubectl("delete", "resourceclaim", "-n", NS, f"{tag}-shared", "--wait=false", check=False)


def test_a_qos_gpu_limit_per_user_holds_her_pods_and_her_sbatch_jobs_alike(
        bridge: Sandbox, tag: str) -> None:
    """QOS gpu2 lets a user hold 2 GPUs at once. alice's first pod (2 GPUs, annotated with the QOS)
    runs; her second pod and her sbatch job with --qos=gpu2 both pend with Slurm's reason
    QOSMaxGRESPerUser, the pod saying so in its events, and both run once the first pod is done."""
    qos = {"slurm-k8s-bridge/qos": "gpu2"}
    create(bridge, template(f"{tag}-two", 2),
           with_gpus(bare_pod(f"{tag}-first", SHOW.format(hold=12), annotations=dict(qos)), f"{tag}-two"))
    first = wait_until("the first pod to run", lambda: (
        p if (p := pod(bridge, f"{tag}-first")) and p["status"].get("phase") == "Running" else None),
        timeout=90)
    create(bridge, with_gpus(bare_pod(f"{tag}-second", SHOW.format(hold=1), annotations=dict(qos)),
                             f"{tag}-two"))
    sbatch_job, _ = sbatch_gpus(bridge, f"{tag}-capped", "--qos=gpu2", "--gres=gpu:1", hold=1, user="alice")
    said = wait_until("the second pod to say Slurm's reason", lambda: (
        text if "QOSMaxGRESPerUser" in (text := events(bridge, f"{tag}-second")) else None), timeout=60)
    assert "pending: QOSMaxGRESPerUser" in said, said
    reason = bridge.slurm("squeue", "-h", "-j", str(sbatch_job), "-o", "%r").stdout.strip()
    assert reason == "QOSMaxGRESPerUser", reason
    first_job = slurm_job_of(first)
    assert first_job is not None and running(bridge, first_job)
    second = pod(bridge, f"{tag}-second")
    assert second is not None and not second["spec"].get("nodeName"), "the limit let a third GPU through"
    second_job = slurm_job_of(second)
    assert second_job is not None
    for job_id in (first_job, second_job):
        row = final(bridge, job_id, timeout=120)
        assert (row["State"], row["ExitCode"]) == ("COMPLETED", "0:0"), f"{row}\n{job_trail(job_id)}"
    row = bridge.wait_job_final(sbatch_job, timeout=120)
    assert (row["State"], row["ExitCode"]) == ("COMPLETED", "0:0"), f"{row}\n{job_trail(sbatch_job)}"


def test_a_job_keeps_its_gpus_while_a_pod_its_owner_deleted_still_runs(bridge: Sandbox, tag: str) -> None:
    """alice deletes her running GPU pod with a 25 s grace, its container ignoring SIGTERM: the kubelet
    stops it only at the grace's end, so its Slurm job keeps the GPUs until then (bob's sbatch job on
    them pends), is cancelled once the pod is gone, and bob's job then sees all four; no device was
    ever held twice."""
    create(bridge, template(f"{tag}-four", 4),
           with_gpus(bare_pod(f"{tag}-stubborn", "trap '' TERM; " + SHOW.format(hold=600)), f"{tag}-four"))
    with ClaimSampler(bridge) as sampler:
        running_pod = wait_until("the pod to run", lambda: (
            p if (p := pod(bridge, f"{tag}-stubborn")) and p["status"].get("phase") == "Running" else None),
            timeout=90)
        job_id = slurm_job_of(running_pod)
        assert job_id is not None
        node = running_pod["spec"]["nodeName"]
        as_alice(bridge, "delete", "pod", f"{tag}-stubborn", "--grace-period=25", "--wait=false")
        bobs, out = sbatch_gpus(bridge, f"{tag}-after", "-w", node, "--gres=gpu:4", hold=1)
        time.sleep(10)
        assert pod(bridge, f"{tag}-stubborn") is not None, "the pod went before its grace"
        assert running(bridge, job_id), "the job gave its GPUs back while its pod still ran"
        assert not running(bridge, bobs), "bob's job got GPUs a running pod still held"
        row = final(bridge, job_id, timeout=90)
        assert row["State"].startswith("CANCELLED"), f"{row}\n{job_trail(job_id)}"
        left = pod(bridge, f"{tag}-stubborn")  # gone, or its containers stopped (its object goes next)
        assert left is None or left["status"].get("phase") in ("Succeeded", "Failed"), \
            f"the job ended while its pod still ran: {left['status']}"
        row = bridge.wait_job_final(bobs, timeout=120)
    assert (row["State"], row["ExitCode"]) == ("COMPLETED", "0:0"), f"{row}\n{job_trail(bobs)}"
    assert sorted(int(i) for i in re.findall(r"^cdi (\d+)$", out.read_text(), re.M)) == [0, 1, 2, 3]
    assert not sampler.overlaps, sampler.overlaps[:5]
