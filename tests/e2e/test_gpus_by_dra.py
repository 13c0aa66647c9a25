"""GPUs by DRA (issue 19), on the sandbox's real kubelets with a real DRA driver (kubernetes-sigs'
dra-example-driver: mock GPUs gpu-0..gpu-3 per node, each injected through CDI as the variable
GPU_DEVICE_<n>=gpu-<n>) and containerd with CDI on. Partition `dra` = the real nodes, gpu_mode "dra".

What a job may touch is read from the ResourceClaims the API server holds, not only from what the
job prints: a sampler lists every claim of the cluster while jobs run and checks that no device is
ever held by two live claims at once."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import bridge_ready
from tests.e2e.sandbox import BRIDGE_UP, JOB_NAMESPACE, Sandbox, job_trail, wait_until, write_script
from tests.e2e.test_bridge_survives_and_scales import _daemon_pid
from tests.e2e.test_parity_gpus_per_task import _side_by_side

pytestmark = pytest.mark.e2e

DRIVER = "gpu.example.com"
SHOW = r"""#!/bin/sh
#K8S image=sandbox.local/busybox:1
echo "job $SLURM_JOB_GPUS cuda=$CUDA_VISIBLE_DEVICES"
env | sed -n 's/^GPU_DEVICE_\([0-9]*\)=gpu-[0-9]*$/cdi \1/p' | sort
sleep "${HOLD:-2}"
"""


def _claims(sandbox: Sandbox) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = sandbox.kubectl_json("get", "resourceclaims", "-A")["items"]
    return items


def _held(claim: dict[str, Any]) -> set[tuple[str, str]]:
    results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []
    return {(r["pool"], r["device"]) for r in results if r["driver"] == DRIVER}


def _claims_of(sandbox: Sandbox, job_id: int) -> list[dict[str, Any]]:
    return [
        c
        for c in _claims(sandbox)
        if (c["metadata"].get("labels") or {}).get("slurm-k8s-bridge/job-id") == str(job_id)
    ]


class ClaimSampler:
    """Lists every claim of the cluster, over and over, in a thread: each device's live holders."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        self.samples = 0
        self.overlaps: list[str] = []
        self.held_by: dict[str, set[tuple[str, str]]] = {}
        """Claim (namespace/name) -> every device it was seen holding."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            out = self.sandbox.kubectl("get", "resourceclaims", "-A", "-o", "json", check=False)
            if out.returncode == 0:
                holders: dict[tuple[str, str], list[str]] = {}
                for claim in json.loads(out.stdout)["items"]:
                    key = f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"
                    for device in _held(claim):
                        holders.setdefault(device, []).append(key)
                        self.held_by.setdefault(key, set()).add(device)
                self.overlaps += [f"{d}: {h}" for d, h in holders.items() if len(h) > 1]
                self.samples += 1
            time.sleep(0.1)

    def __enter__(self) -> ClaimSampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _submit(
    sandbox: Sandbox, name: str, *options: str, hold: int = 2, user: str = "alice"
) -> tuple[int, Path]:
    script = write_script(sandbox, user, "dra-show.sh", SHOW)
    out = sandbox.home(user) / f"dra-{name}-%j.out"
    job_id = sandbox.sbatch(
        "-p", "dra", *options, f"--export=ALL,HOLD={hold}", "-o", str(out), str(script), user=user
    )
    return job_id, Path(str(out).replace("%j", str(job_id)))


def _check_output(sandbox: Sandbox, job_id: int, out: Path) -> list[int]:
    """The job ended 0, and the devices the runtime injected are exactly Slurm's indices; returns them."""
    row = sandbox.wait_job_final(job_id, timeout=180)
    text = out.read_text(errors="replace")
    assert (row["State"], row["ExitCode"]) == ("COMPLETED", "0:0"), f"{row}\n{text}\n{job_trail(job_id)}"
    head = re.search(r"^job (\S+) cuda=(\S+)$", text, re.M)
    assert head, text
    indices = [int(i) for i in head.group(1).split(",")]
    injected = sorted(int(i) for i in re.findall(r"^cdi (\d+)$", text, re.M))
    assert injected == sorted(indices), f"CDI injected {injected}, Slurm gave {indices}:\n{text}"
    assert head.group(2) == ",".join(str(i) for i in range(len(indices))), text  # as under ConstrainDevices
    return indices


def test_a_job_sees_exactly_the_devices_slurm_gave_it(bridge: Sandbox) -> None:
    job_id, out = _submit(bridge, "one", "-w", "kreal1", "--gres=gpu:2", hold=6)
    claims = wait_until(
        f"job {job_id}'s claim allocated",
        lambda: [c for c in _claims_of(bridge, job_id) if _held(c)],
        timeout=60,
    )
    indices = _check_output(bridge, job_id, out)
    assert [_held(c) for c in claims] == [{("kreal1", f"gpu-{i}") for i in indices}]
    (claim,) = claims
    assert claim["status"]["reservedFor"][0]["name"] == claim["metadata"]["ownerReferences"][0]["name"]
    wait_until(f"job {job_id}'s claim gone with its pod", lambda: not _claims_of(bridge, job_id), timeout=60)


def test_two_jobs_on_one_node_each_see_only_their_own(bridge: Sandbox) -> None:
    with ClaimSampler(bridge) as sampler:
        jobs = [_submit(bridge, f"pair{i}", "-w", "kreal2", "--gres=gpu:2", hold=5) for i in range(2)]
        seen = [set(_check_output(bridge, job_id, out)) for job_id, out in jobs]
    assert seen[0].isdisjoint(seen[1]) and len(seen[0] | seen[1]) == 4, seen
    assert sampler.overlaps == [], sampler.overlaps[:5]


def test_64_mixed_jobs_over_both_nodes_never_share_a_device(bridge: Sandbox) -> None:
    """1- and 2-GPU jobs, 64 at once (the load bar) on 8 GPUs: most wait in Slurm, and each one that
    starts takes GPUs another just gave back, while that one's claim may still be on its way out."""
    with ClaimSampler(bridge) as sampler:
        jobs = [
            _submit(
                bridge, f"mix{i}", f"--gres=gpu:{1 + i % 2}", hold=1 + i % 3, user="alice" if i % 2 else "bob"
            )
            for i in range(64)
        ]
        for job_id, out in jobs:
            _check_output(bridge, job_id, out)
    assert sampler.samples > 20
    assert sampler.overlaps == [], sampler.overlaps[:5]
    ours = [key for key in sampler.held_by if key.startswith(f"{JOB_NAMESPACE}/")]
    assert len(ours) >= 64, f"every job's claim seen holding its devices: {len(ours)}"
    wait_until(
        "no claim of these jobs left",
        lambda: not any(_claims_of(bridge, job_id) for job_id, _ in jobs),
        timeout=60,
    )


def test_the_gres_parity_cases_match_native(bridge: Sandbox) -> None:
    """GPUs per task and per step, in `dra` as in `native` (tests/e2e/test_parity_gpus_per_task.py)."""
    _side_by_side(bridge, 1, partition="dra")


def test_scancel_the_time_limit_and_a_killed_daemon_leave_no_claim(bridge: Sandbox) -> None:
    cancelled, _ = _submit(bridge, "cancel", "--gres=gpu:1", hold=300)
    timed_out, _ = _submit(bridge, "timeout", "--gres=gpu:1", "--time=1", hold=300)
    survivors = [_submit(bridge, f"kill9-{i}", "--gres=gpu:1", hold=12) for i in range(3)]
    every = [cancelled, timed_out, *(job_id for job_id, _ in survivors)]
    wait_until(
        "every job's claim allocated",
        lambda: all(any(_held(c) for c in _claims_of(bridge, job_id)) for job_id in every),
        timeout=90,
    )
    bridge.slurm("scancel", str(cancelled))
    os.kill(_daemon_pid(), signal.SIGKILL)
    time.sleep(3)
    assert not bridge_ready()
    subprocess.run([str(BRIDGE_UP)], check=True, capture_output=True)
    for job_id, out in survivors:
        _check_output(bridge, job_id, out)
    assert bridge.wait_job_final(cancelled, timeout=60)["State"].startswith("CANCELLED")
    assert bridge.wait_job_final(timed_out, timeout=150)["State"] == "TIMEOUT"
    wait_until(
        "no claim of these jobs left",
        lambda: not any(_claims_of(bridge, job_id) for job_id in every),
        timeout=90,
    )


def test_a_device_kubernetes_gave_to_another_workload_fails_the_job_with_the_reason(bridge: Sandbox) -> None:
    """A claim outside the bridge holds all of kreal2's GPUs: a job Slurm sends there cannot have
    them, and says so where its user looks (its -e file and its comment)."""
    bridge.kubectl("create", "namespace", "dra-squatter", check=False)
    squat = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "all-of-kreal2", "namespace": "dra-squatter"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "r",
                        "exactly": {"deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": 4},
                    }
                ]
            }
        },
    }
    bridge.kubectl_create(squat)
    try:
        status = {
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {"request": "r", "driver": DRIVER, "pool": "kreal2", "device": f"gpu-{i}"}
                            for i in range(4)
                        ]
                    }
                }
            }
        }
        bridge.kubectl(
            "patch",
            "resourceclaim",
            "all-of-kreal2",
            "-n",
            "dra-squatter",
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps(status),
        )
        wait_until(
            "the squatter's allocation",
            lambda: any(_held(c) for c in _claims(bridge) if c["metadata"]["name"] == "all-of-kreal2"),
            timeout=30,
        )
        job_id, out = _submit(bridge, "squatted", "-w", "kreal2", "--gres=gpu:1")
        row = bridge.wait_job_final(job_id, timeout=90)
        assert (row["State"], row["ExitCode"]) == ("FAILED", "1:0"), row
        text = out.read_text(errors="replace")
        assert "held by ResourceClaim dra-squatter/all-of-kreal2" in text, text
        shown = bridge.slurm("scontrol", "show", "job", str(job_id)).stdout
        assert re.search(r"Comment=slurm-k8s-bridge: .*dra-squatter/all-of-kreal2", shown), shown
        assert not any(_held(c) for c in _claims_of(bridge, job_id)), "the job never took a held device"
    finally:
        bridge.kubectl("delete", "namespace", "dra-squatter", "--wait=false", check=False)


def test_no_variable_or_directive_reaches_devices_slurm_did_not_give(bridge: Sandbox) -> None:
    """Hostile user: every GPU variable set to everything in the job's environment.
    The claims (what the kubelet prepares and the runtime injects) hold Slurm's devices only."""
    hostile = (
        "--export=ALL,HOLD=3,NVIDIA_VISIBLE_DEVICES=all,CUDA_VISIBLE_DEVICES=0,1,2,3,"
        "SLURM_JOB_GPUS=0,1,2,3,GPU_DEVICE_0=gpu-0,GPU_DEVICE_1=gpu-1,GPU_DEVICE_2=gpu-2,GPU_DEVICE_3=gpu-3"
    )
    script = write_script(bridge, "bob", "dra-hostile.sh", SHOW)
    out = bridge.home("bob") / "dra-hostile.out"
    with ClaimSampler(bridge) as sampler:
        job_id = bridge.sbatch(
            "-p", "dra", "-w", "kreal1", "--gres=gpu:1", hostile, "-o", str(out), str(script), user="bob"
        )
        bridge.wait_job_final(job_id, timeout=120)
    held = [d for key, d in sampler.held_by.items() if f"/slurm-{job_id}-" in key]
    assert [len(d) for d in held] == [1], (
        f"one device held for a 1-GPU job, whatever the variables say: {held}"
    )


def test_a_claim_kubernetes_refuses_fails_the_job_with_the_reason(bridge: Sandbox) -> None:
    """A quota of no claims in the job namespace: the job's GPU claim is refused (403, for good once
    it has lasted 20 s), and the job ends 1:0 with Kubernetes' words in its -e file."""
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-claims", "namespace": JOB_NAMESPACE},
        "spec": {"hard": {"count/resourceclaims.resource.k8s.io": "0"}},
    }
    bridge.kubectl_create(quota)
    try:
        wait_until(
            "the quota counted",
            lambda: (
                bridge.kubectl_json("get", "resourcequota", "no-claims", "-n", JOB_NAMESPACE)
                .get("status", {})
                .get("hard")
            ),
            timeout=30,
        )
        job_id, out = _submit(bridge, "refused", "--gres=gpu:1")
        row = bridge.wait_job_final(job_id, timeout=120)
        text = out.read_text(errors="replace")
        assert (row["State"], row["ExitCode"]) == ("FAILED", "1:0"), f"{row}\n{text}\n{job_trail(job_id)}"
        assert "Kubernetes refused the GPU claim" in text and "exceeded quota" in text, text
    finally:
        bridge.kubectl("delete", "resourcequota", "no-claims", "-n", JOB_NAMESPACE, check=False)


def test_a_driver_that_is_down_fails_the_job_with_the_reason(bridge: Sandbox) -> None:
    """kreal2's DRA driver is killed: a job Slurm sends there cannot have its devices prepared (or,
    once the kubelet has withdrawn the driver's slices, mapped), and says why. The driver is started
    again by the sandbox's own start-up, and kreal2 publishes its devices again. (Last in this file:
    the restart withdraws kreal2's slices for a moment.)"""
    pid_file = Path("/var/lib/slurm-k8s-sandbox/run/dra-plugin-kreal2.pid")
    os.kill(int(pid_file.read_text()), signal.SIGKILL)
    try:
        job_id, out = _submit(bridge, "driver-down", "-w", "kreal2", "--gres=gpu:1")
        row = bridge.wait_job_final(job_id, timeout=120)
        text = out.read_text(errors="replace")
        assert (row["State"], row["ExitCode"]) == ("FAILED", "1:0"), f"{row}\n{text}\n{job_trail(job_id)}"
        assert "FailedPrepareDynamicResources" in text or "is the driver running there?" in text, text
        wait_until(f"job {job_id}'s claim gone", lambda: not _claims_of(bridge, job_id), timeout=60)
    finally:
        subprocess.run([str(BRIDGE_UP.parents[1] / "kube" / "up.sh")], check=True, capture_output=True)
    wait_until(
        "kreal2's devices published again",
        lambda: any(
            s["spec"].get("nodeName") == "kreal2" and len(s["spec"].get("devices") or []) == 4
            for s in bridge.kubectl_json("get", "resourceslices")["items"]
        ),
        timeout=120,
    )
    job_id, out = _submit(bridge, "driver-back", "-w", "kreal2", "--gres=gpu:1")
    _check_output(bridge, job_id, out)
