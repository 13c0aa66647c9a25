"""Kubernetes workloads scheduled by Slurm (issue 20), on the real kubelets: a Job, a labelled gang or
a bare pod in a managed namespace waits in Slurm's queue as ONE job of the namespace's user and
account, starts where Slurm placed it, and ends in sacct with its real state and exit code, as the
same work submitted with sbatch does.

The user is alice, with `edit` in her namespace team-alice (kubectl --as): what she can do, a
Kubernetes user of a real site can do."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.sandbox import Sandbox, job_trail, wait_until, write_script

pytestmark = pytest.mark.e2e

NS = "team-alice"
ALICE = ("--as=alice", "--as-group=system:authenticated")
IMAGE = "sandbox.local/busybox:1"
SLURM_JOB = "slurm-k8s-bridge/slurm-job-id"
FIELDS = "JobID,JobName%60,User,Account,Partition,State,ExitCode,NodeList,Start"


def as_alice(sandbox: Sandbox, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kubectl", "-n", NS, *args, *ALICE], input=stdin, env=sandbox.environ(),
                          capture_output=True, text=True, timeout=60)


# Small requests: the real kubelets have the VM's 2 CPUs while Slurm counts 8 per node (a kubelet
# refuses a pod beyond its own allocatable, whatever Slurm allocated: OutOfcpu).
def container(command: str, cpu: str = "100m", memory: str = "32Mi") -> dict[str, Any]:
    return {"name": "main", "image": IMAGE, "imagePullPolicy": "Never", "command": ["sh", "-c", command],
            "resources": {"requests": {"cpu": cpu, "memory": memory},
                          "limits": {"cpu": cpu, "memory": memory}},
            "securityContext": {"runAsUser": 2001, "runAsGroup": 2001, "runAsNonRoot": True,
                                "allowPrivilegeEscalation": False}}


def batch_job(name: str, pods: int, command: str, *, cpu: str = "100m",
              annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """An Indexed Job (JOB_COMPLETION_INDEX tells its pods apart) of `pods` pods at once, no retry."""
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0, "completionMode": "Indexed",
                     "template": {"metadata": {"annotations": annotations or {}},
                                  "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 2,
                                           "containers": [container(command, cpu)]}}}}


def bare_pod(name: str, command: str, *, cpu: str = "100m", memory: str = "32Mi",
             labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
             image: str = IMAGE) -> dict[str, Any]:
    spec = {"restartPolicy": "Never", "terminationGracePeriodSeconds": 2,
            "containers": [{**container(command, cpu, memory), "image": image}]}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
            "spec": spec}


def create(sandbox: Sandbox, *manifests: dict[str, Any]) -> None:
    done = as_alice(sandbox, "create", "-f", "-", stdin="\n".join(json.dumps(m) for m in manifests))
    assert done.returncode == 0, done.stderr


def pods_of(sandbox: Sandbox, selector: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = sandbox.kubectl_json("get", "pods", "-n", NS, "-l", selector)["items"]
    return items


def pod(sandbox: Sandbox, name: str) -> dict[str, Any] | None:
    done = sandbox.kubectl("get", "pod", "-n", NS, name, "-o", "json", check=False)
    return json.loads(done.stdout) if done.returncode == 0 else None


def slurm_job_of(p: dict[str, Any]) -> int | None:
    value = (p["metadata"].get("annotations") or {}).get(SLURM_JOB, "")
    return int(value) if value.isdigit() else None


def sacct(sandbox: Sandbox, job_id: int) -> dict[str, str]:
    out = sandbox.slurm("sacct", "-X", "-n", "-P", "-j", str(job_id), "-o", FIELDS.replace("%60", "")).stdout
    rows = [dict(zip([f.split("%")[0] for f in FIELDS.split(",")], line.split("|"), strict=True))
            for line in out.splitlines()]
    return next((row for row in rows if row["JobID"] == str(job_id)), {})


def jobs_named(sandbox: Sandbox, name: str) -> list[dict[str, str]]:
    """Every Slurm job of that name (all users, last hour): a gang must be exactly one."""
    out = sandbox.slurm("sacct", "-a", "-X", "-n", "-P", "-S", "now-1hours", "--name", name,
                        "-o", FIELDS.replace("%60", "")).stdout
    return [dict(zip([f.split("%")[0] for f in FIELDS.split(",")], line.split("|"), strict=True))
            for line in out.splitlines()]


def final(sandbox: Sandbox, job_id: int, timeout: float = 120) -> dict[str, str]:
    def ended() -> dict[str, str] | None:
        row = sacct(sandbox, job_id)
        return row if row.get("State") not in (None, "", "PENDING", "RUNNING") else None

    return wait_until(f"Slurm job {job_id} to end", ended, timeout=timeout)


def hostnames(sandbox: Sandbox, nodelist: str) -> set[str]:
    return set(sandbox.slurm("scontrol", "show", "hostnames", nodelist).stdout.split())


def events(sandbox: Sandbox, name: str) -> str:
    return sandbox.kubectl("get", "events", "-n", NS, "--field-selector", f"involvedObject.name={name}",
                           "-o", "custom-columns=R:.reason,M:.message", "--no-headers", check=False).stdout


@pytest.fixture
def tag(bridge: Sandbox) -> Iterator[str]:
    """A name prefix of this test's objects, all removed afterwards (Jobs with their pods)."""
    prefix = f"e2e-{uuid.uuid4().hex[:6]}"
    yield prefix
    for kind in ("jobs", "pods"):
        names = [o["metadata"]["name"] for o in bridge.kubectl_json("get", kind, "-n", NS)["items"]
                 if o["metadata"]["name"].startswith(prefix)]
        if names:
            bridge.kubectl("delete", kind, "-n", NS, "--wait=false", "--grace-period=0", "--force", *names,
                           check=False)


@pytest.mark.shares_the_cluster
def test_jobs_are_one_slurm_job_each_under_alices_account_with_their_real_exit_code(
        bridge: Sandbox, tag: str) -> None:
    """Six Jobs of two pods at once: each is ONE Slurm job of alice's, in lab_alice, ending as the same
    two tasks end natively (COMPLETED 0:0, FAILED 3:0, FAILED 5:0: the highest code, as srun's)."""
    codes = {f"{tag}-ok": (0, 0), f"{tag}-three": (3, 0), f"{tag}-mixed": (0, 5), f"{tag}-ok2": (0, 0),
             f"{tag}-seven": (7, 7), f"{tag}-one": (1, 0)}
    create(bridge, *(batch_job(name, 2, f'echo "rank of $(hostname)"; [ "$JOB_COMPLETION_INDEX" = 1 ] '
                                        f'&& exit {second}; exit {first}')
                     for name, (first, second) in codes.items()))
    native = {}
    for code in sorted({max(c) for c in codes.values()}):
        native[code] = bridge.sbatch("-p", "native", "-n", "2", "--wrap", f"exit {code}")
    for name, (first, second) in codes.items():
        # A Job whose pod failed deletes the other (backoffLimit 0): one may be gone already.
        pods = wait_until(f"{name}'s pods to carry their Slurm job", lambda n=name: (
            found if (found := pods_of(bridge, f"job-name={n}")) and all(map(slurm_job_of, found))
            else None), timeout=60)
        job_ids = {slurm_job_of(p) for p in pods}
        assert len(job_ids) == 1, f"{name}: the gang became several Slurm jobs: {job_ids}"
        job_id = job_ids.pop()
        assert job_id is not None
        row = final(bridge, job_id)
        rows = jobs_named(bridge, f"{NS}/{name}")
        assert [r["JobID"] for r in rows] == [str(job_id)], rows
        assert (row["User"], row["Account"], row["Partition"]) == ("alice", "lab_alice", "k8s"), row
        expected = max(first, second)
        assert (row["State"], row["ExitCode"]) == \
            ("COMPLETED" if expected == 0 else "FAILED", f"{expected}:0"), f"{row}\n{job_trail(job_id)}"
        native_row = bridge.wait_job_final(native[expected])
        assert (row["State"], row["ExitCode"]) == (native_row["State"], native_row["ExitCode"])
        allocated = hostnames(bridge, row["NodeList"])
        logged = 0
        for p in pods_of(bridge, f"job-name={name}"):
            pod = p["metadata"]["name"]
            assert p["spec"]["nodeName"] in allocated, f"{pod} ran outside {allocated}"
            log = bridge.kubectl("logs", "-n", NS, pod, check=False)
            if log.returncode == 0:
                assert "rank of" in log.stdout, log.stdout
                logged += 1
                continue
            # Only a failed Job's controller deletes its other pods; such a pod may go between the
            # listing and `kubectl logs`, and only then may its log be missing.
            assert expected != 0, f"{pod}: no log though its Job succeeded: {log.stderr}"
            now = bridge.kubectl("get", "pod", "-n", NS, pod, "-o", "json", check=False)
            assert now.returncode != 0 or json.loads(now.stdout)["metadata"].get("deletionTimestamp"), \
                f"{pod}: no log and not being deleted: {log.stderr}"
        assert logged, f"{name}: no pod's log was readable"


def test_pods_wait_behind_an_sbatch_job_and_say_why_where_kubectl_looks(bridge: Sandbox, tag: str) -> None:
    """bob's sbatch job holds both real nodes: alice's Job waits in Slurm's queue, unbound, its pods'
    PodScheduled condition and events naming the Slurm job and its reason; it starts when bob's ends."""
    script = write_script(bridge, "bob", f"{tag}-blocker.sh", f"#!/bin/sh\n#K8S image={IMAGE}\nsleep 300\n")
    blocker = bridge.sbatch("-p", "k8s", "-N", "2", "--exclusive", "-o", "/dev/null", str(script), user="bob")
    try:
        wait_until("bob's job to run", lambda: sacct(bridge, blocker).get("State") == "RUNNING", timeout=60)
        create(bridge, batch_job(f"{tag}-queued", 2, "echo ran"))

        def waiting_with_a_reason() -> list[dict[str, Any]] | None:
            pods = pods_of(bridge, f"job-name={tag}-queued")
            conditions = [next((c for c in p["status"].get("conditions") or []
                                if c["type"] == "PodScheduled"), {}) for p in pods]
            # Slurm's reason is None until its scheduler has looked at the job (the condition
            # follows it): wait for the reason the scheduler gives.
            if len(pods) == 2 and all(c.get("reason") == "SlurmPending" and any(
                    word in c.get("message", "") for word in ("Resources", "Priority")) for c in conditions):
                return pods
            return None

        pods = wait_until("the pods to say why they wait", waiting_with_a_reason, timeout=60)
        job_id = slurm_job_of(pods[0])
        assert job_id is not None
        for p in pods:
            assert not p["spec"].get("nodeName"), "a pod was bound while Slurm had not started its job"
            condition = next(c for c in p["status"]["conditions"] if c["type"] == "PodScheduled")
            assert condition["status"] == "False"
            assert f"Slurm job {job_id} pending: " in condition["message"], condition
            assert any(word in condition["message"] for word in ("Resources", "Priority")), condition
            described = bridge.kubectl("describe", "pod", "-n", NS, p["metadata"]["name"]).stdout
            assert "SlurmPending" in described and f"Slurm job {job_id}" in described, described
        assert sacct(bridge, job_id)["State"] == "PENDING"
    finally:
        bridge.slurm("scancel", str(blocker), check=False)
    row = final(bridge, job_id)
    assert (row["State"], row["ExitCode"]) == ("COMPLETED", "0:0"), f"{row}\n{job_trail(job_id)}"


def test_a_labelled_gang_spans_two_nodes_and_waits_for_its_last_pod(bridge: Sandbox, tag: str) -> None:
    """Two pods labelled as one gang of 2, each wanting 5 GiB of a node's 8 (in Slurm): nothing is
    submitted until both exist, then one Slurm job on both real nodes, and each pod on its own node."""
    gang = {"slurm-k8s-bridge/gang": f"{tag}-ddp"}
    size = {"slurm-k8s-bridge/gang-size": "2"}
    create(bridge, bare_pod(f"{tag}-w0", "echo w0", memory="5Gi", labels=gang, annotations=size))
    time.sleep(3)
    first = pod(bridge, f"{tag}-w0")
    assert first is not None and slurm_job_of(first) is None, "half a gang was submitted"
    create(bridge, bare_pod(f"{tag}-w1", "echo w1", memory="5Gi", labels=gang, annotations=size))
    pods = wait_until("both pods to carry one Slurm job", lambda: (
        found if len(found := pods_of(bridge, f"slurm-k8s-bridge/gang={tag}-ddp")) == 2
        and all(map(slurm_job_of, found)) else None), timeout=60)
    job_id = slurm_job_of(pods[0])
    assert job_id is not None and {slurm_job_of(p) for p in pods} == {job_id}
    row = final(bridge, job_id)
    assert (row["State"], row["ExitCode"]) == ("COMPLETED", "0:0"), f"{row}\n{job_trail(job_id)}"
    nodes = [p["spec"]["nodeName"] for p in pods_of(bridge, f"slurm-k8s-bridge/gang={tag}-ddp")]
    assert sorted(nodes) == sorted(hostnames(bridge, row["NodeList"])) == ["kreal1", "kreal2"], (nodes, row)


@pytest.mark.shares_the_cluster
def test_scancel_removes_the_pods_and_deleting_the_job_cancels_slurms(bridge: Sandbox, tag: str) -> None:
    """Both directions: `scancel` of a running gang's job deletes its pod (with its grace), and
    `kubectl delete job` of a running Job ends its Slurm job CANCELLED."""
    create(bridge, bare_pod(f"{tag}-sleeper", "sleep 600"), batch_job(f"{tag}-deleted", 1, "sleep 600"))
    sleeper = wait_until("the bare pod to run", lambda: (
        p if (p := pod(bridge, f"{tag}-sleeper")) and p["status"].get("phase") == "Running" else None),
        timeout=60)
    job_pod = wait_until("the Job's pod to run", lambda: (
        found[0] if (found := pods_of(bridge, f"job-name={tag}-deleted"))
        and found[0]["status"].get("phase") == "Running" else None), timeout=60)
    scancelled, deleted = slurm_job_of(sleeper), slurm_job_of(job_pod)
    assert scancelled is not None and deleted is not None
    bridge.slurm("scancel", str(scancelled), user="alice")
    as_alice(bridge, "delete", "job", f"{tag}-deleted", "--wait=false")
    wait_until("the scancelled job's pod to be deleted", lambda: pod(bridge, f"{tag}-sleeper") is None,
               timeout=60)
    for job_id in (scancelled, deleted):
        row = final(bridge, job_id, timeout=60)
        assert row["State"].startswith("CANCELLED"), f"{row}\n{job_trail(job_id)}"


@pytest.mark.shares_the_cluster
def test_what_slurm_or_the_kubelet_refuses_is_told_on_the_pod(bridge: Sandbox, tag: str) -> None:
    """A forbidden account never becomes a job; more CPUs than any node has pends with Slurm's reason
    (PartitionConfig, as an sbatch job asking that much does); an image the node does not have fails
    the job (1:0) within the start deadline. Each pod's events say why."""
    create(bridge,
           bare_pod(f"{tag}-bobs", "true", annotations={"slurm-k8s-bridge/account": "lab_bob"}),
           bare_pod(f"{tag}-huge", "true", cpu="64"),
           bare_pod(f"{tag}-noimage", "true", image="sandbox.local/no-such-image:1"))
    said = wait_until("the refusal and the reason on the pods", lambda: (
        (bobs, huge) if "not allowed" in (bobs := events(bridge, f"{tag}-bobs"))
        and "PartitionConfig" in (huge := events(bridge, f"{tag}-huge")) else None), timeout=60)
    assert "account 'lab_bob' is not allowed in namespace team-alice" in said[0], said[0]
    bobs = pod(bridge, f"{tag}-bobs")
    assert bobs is not None and slurm_job_of(bobs) is None and not bobs["spec"].get("nodeName"), bobs
    huge = pod(bridge, f"{tag}-huge")
    assert huge is not None and not huge["spec"].get("nodeName"), huge
    huge_job = slurm_job_of(huge)
    assert huge_job is not None and sacct(bridge, huge_job)["State"] == "PENDING"
    noimage = wait_until("the imageless pod's job", lambda: (
        p if (p := pod(bridge, f"{tag}-noimage")) and slurm_job_of(p) else None), timeout=60)
    job_id = slurm_job_of(noimage)
    assert job_id is not None
    row = final(bridge, job_id, timeout=90)
    assert (row["State"], row["ExitCode"]) == ("FAILED", "1:0"), f"{row}\n{job_trail(job_id)}"
    told = wait_until("the failure on the pod", lambda: (
        text if "SlurmJobFailed" in (text := events(bridge, f"{tag}-noimage")) else None), timeout=30)
    assert "ErrImageNeverPull" in told, told


@pytest.mark.shares_the_cluster
def test_a_pod_never_runs_as_root_privileged_or_as_another_user(bridge: Sandbox, tag: str) -> None:
    """Hostile alice: a pod that is privileged, runs as root (or as the image likes), or mounts the
    host never becomes a job; one that says it runs as bob's uid gets a Slurm job of alice's, and that
    job fails (1:0) before the pod is ever bound. Each is told on the pod."""
    def hostile(name: str, change: dict[str, Any], pod_spec: dict[str, Any] | None = None) -> dict[str, Any]:
        manifest = bare_pod(f"{tag}-{name}", "id")
        manifest["spec"]["containers"][0]["securityContext"].update(change)
        manifest["spec"].update(pod_spec or {})
        return manifest

    create(bridge,
           hostile("privileged", {"privileged": True, "allowPrivilegeEscalation": True}),
           hostile("root", {"runAsUser": 0, "runAsNonRoot": False}),
           hostile("hostpath", {}, {"volumes": [{"name": "etc", "hostPath": {"path": "/etc"}}]}),
           hostile("asbob", {"runAsUser": 2002, "runAsGroup": 2002}))
    for name, said in (("privileged", "is privileged"), ("root", "must set runAsUser"),
                       ("hostpath", "hostPath volume etc")):
        told = wait_until(f"the {name} pod's refusal", lambda n=name: (
            text if "SlurmRefused" in (text := events(bridge, f"{tag}-{n}")) else None), timeout=60)
        assert said in told, told
        refused = pod(bridge, f"{tag}-{name}")
        assert refused is not None and slurm_job_of(refused) is None and not refused["spec"].get("nodeName")
    # Its job ends at once, and its pod goes with it: found by name in sacct.
    rows = wait_until("the job of the pod claiming bob's uid",
                      lambda: jobs_named(bridge, f"{NS}/{tag}-asbob"), timeout=60)
    job_id = int(rows[0]["JobID"])
    row = final(bridge, job_id)
    assert (row["User"], row["State"], row["ExitCode"]) == ("alice", "FAILED", "1:0"), \
        f"{row}\n{job_trail(job_id)}"
    told = wait_until("the failure on the pod", lambda: (
        text if "SlurmJobFailed" in (text := events(bridge, f"{tag}-asbob")) else None), timeout=30)
    assert "runs as 2002:2002, not as the Slurm job's user 2001:2001" in told, told
    gone = pod(bridge, f"{tag}-asbob")
    assert gone is None or not gone["spec"].get("nodeName"), "the pod was bound as another user"


def usage(sandbox: Sandbox, account: str) -> float:
    out = sandbox.slurm("sshare", "-n", "-P", "-A", account, "-o", "Account,User,RawUsage").stdout
    return max((float(line.split("|")[2] or 0) for line in out.splitlines() if line.split("|")[1] == ""),
               default=0.0)


def test_fair_share_puts_the_lighter_account_first_whichever_way_it_submits(
        bridge: Sandbox, tag: str) -> None:
    """Both accounts start from no usage; alice's sbatch job then holds both real nodes long enough to be
    counted. Behind it wait, in this order: alice's Kubernetes Job, alice's sbatch job, bob's Kubernetes
    Job (each needs both nodes). Fair-share, not submission order, decides: bob's Job starts first."""
    for account in ("lab_alice", "lab_bob"):
        bridge.slurm("sacctmgr", "-i", "modify", "account", account, "set", "RawUsage=0")
    script = write_script(bridge, "alice", f"{tag}-heavy.sh", f"#!/bin/sh\n#K8S image={IMAGE}\nsleep 600\n")
    heavy = bridge.sbatch("-p", "k8s", "-N", "2", "--exclusive", "-o", "/dev/null", str(script))
    bob_ns = "team-bob"
    try:
        wait_until("alice's heavy job to run", lambda: sacct(bridge, heavy).get("State") == "RUNNING",
                   timeout=60)
        # Each wants 5 GiB on each of two nodes (Slurm's 8 GiB a node): one at a time.
        big = {"slurm-k8s-bridge/time-limit": "5"}
        # Each runs 3 s: their start times (whole seconds in sacct) then tell their order.
        job = batch_job(f"{tag}-alice", 2, "sleep 3", annotations=big)
        job["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "100m", "memory": "5Gi"}, "limits": {"cpu": "100m", "memory": "5Gi"}}
        create(bridge, job)

        def job_of(namespace: str, name: str) -> int | None:
            items = bridge.kubectl_json("get", "pods", "-n", namespace, "-l", f"job-name={name}")["items"]
            ids = {slurm_job_of(p) for p in items}
            return ids.pop() if len(items) == 2 and len(ids) == 1 else None

        alice_job = wait_until("alice's Job in Slurm", lambda: job_of(NS, f"{tag}-alice"), timeout=60)
        alice_sbatch = write_script(bridge, "alice", f"{tag}-next.sh",
                                    f"#!/bin/sh\n#K8S image={IMAGE}\nsleep 3\n")
        alice_next = bridge.sbatch("-p", "k8s", "-N", "2", "--mem=5G", "-t", "5", "-o", "/dev/null",
                                   str(alice_sbatch))
        bobs = batch_job(f"{tag}-bob", 2, "sleep 3", annotations=big)
        bobs["spec"]["template"]["spec"]["containers"][0]["resources"] = {
            "requests": {"cpu": "100m", "memory": "5Gi"}, "limits": {"cpu": "100m", "memory": "5Gi"}}
        bobs["spec"]["template"]["spec"]["containers"][0]["securityContext"].update(
            runAsUser=2002, runAsGroup=2002)
        done = subprocess.run(["kubectl", "-n", bob_ns, "create", "-f", "-", "--as=bob",
                               "--as-group=system:authenticated"], input=json.dumps(bobs),
                              env=bridge.environ(), capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        bob_job = wait_until("bob's Job in Slurm", lambda: job_of(bob_ns, f"{tag}-bob"), timeout=60)
        # Slurm counts the running job's use once a minute (PriorityCalcPeriod=1, its shortest).
        wait_until("alice's usage to count", lambda: usage(bridge, "lab_alice") > usage(bridge, "lab_bob"),
                   timeout=150, interval=2)
        assert alice_job < alice_next < bob_job, "submitted in this order"
    finally:
        bridge.slurm("scancel", str(heavy), check=False)
    rows = {job_id: final(bridge, job_id, timeout=180) for job_id in (bob_job, alice_job, alice_next)}
    starts = {job_id: row["Start"] for job_id, row in rows.items()}
    assert all(row["State"] == "COMPLETED" for row in rows.values()), rows
    assert starts[bob_job] < starts[alice_job] and starts[bob_job] < starts[alice_next], \
        f"bob's Job ({bob_job}) should start first: {starts}"
    assert rows[bob_job]["User"] == "bob" and rows[bob_job]["Account"] == "lab_bob"
    bridge.kubectl("delete", "job", "-n", bob_ns, f"{tag}-bob", "--wait=false", check=False)


def test_a_preempted_job_gives_its_nodes_back_and_its_jobs_new_pods_wait_again(
        bridge: Sandbox, tag: str) -> None:
    """alice's Kubernetes Job holds both real nodes; bob's `high` sbatch job preempts it. Its pods get
    their grace and go, and its Slurm job ends PREEMPTED, as a non-requeueable sbatch job's does; bob's
    job runs; the pods the Job controller makes anew are a new Slurm job, which completes after it."""
    job = batch_job(f"{tag}-preempted", 2, 'echo "start $(date +%s)"; sleep 20',
                    annotations={"slurm-k8s-bridge/time-limit": "10"})
    job["spec"]["backoffLimit"] = 4
    job["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "100m", "memory": "5Gi"}, "limits": {"cpu": "100m", "memory": "5Gi"}}
    create(bridge, job)
    first = wait_until("alice's Job to run", lambda: (
        found if len(found := pods_of(bridge, f"job-name={tag}-preempted")) == 2
        and all(p["status"].get("phase") == "Running" for p in found) else None), timeout=90)
    job_id = slurm_job_of(first[0])
    assert job_id is not None
    high = write_script(bridge, "bob", f"{tag}-high.sh", f"#!/bin/sh\n#K8S image={IMAGE}\nsleep 3\n")
    high_id = bridge.sbatch("-p", "k8s", "--qos=high", "-N", "2", "--exclusive", "-o", "/dev/null", str(high),
                            user="bob")
    row = final(bridge, job_id, timeout=60)
    assert row["State"] == "PREEMPTED", f"{row}\n{job_trail(job_id)}"
    first_uids = {p["metadata"]["uid"] for p in first}
    wait_until("the first pods to go", lambda: not first_uids & {
        p["metadata"]["uid"] for p in pods_of(bridge, f"job-name={tag}-preempted")}, timeout=60)
    high_row = final(bridge, high_id, timeout=120)
    assert high_row["State"] == "COMPLETED", f"{high_row}\n{job_trail(high_id)}"
    retry = wait_until("the Job's new pods to be a new Slurm job", lambda: next(
        (int(r["JobID"]) for r in jobs_named(bridge, f"{NS}/{tag}-preempted") if r["JobID"] != str(job_id)),
        None), timeout=120)
    retry_row = final(bridge, retry, timeout=180)
    assert (retry_row["State"], retry_row["ExitCode"]) == ("COMPLETED", "0:0"), \
        f"{retry_row}\n{job_trail(retry)}"
    assert high_row["Start"] <= retry_row["Start"], (high_row, retry_row)
    assert len(jobs_named(bridge, f"{NS}/{tag}-preempted")) == 2
    wait_until("the Job to complete", lambda: bridge.kubectl_json(
        "get", "job", "-n", NS, f"{tag}-preempted")["status"].get("succeeded") == 2, timeout=60)
