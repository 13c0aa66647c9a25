"""Kubernetes workloads scheduled by Slurm, the pure part (bridge.core.workloads): which pods form a
gang, the one Slurm job it becomes, where its pods go in Slurm's allocation, and how it ended."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.clients.slurm.rest import refusal_words
from bridge.core.config import ConfigError, parse_config
from bridge.core.config_workloads import ManagedNamespace, WorkloadsConfig
from bridge.core.model import JobAllocation, NodeAllocation
from bridge.core.workload_placement import Placement, place, task_shape
from bridge.core.workloads import (
    WorkloadError,
    foreign_ids,
    gang_comment,
    gang_outcome,
    gang_script,
    is_gang_script,
    job_request,
    job_size,
    pod_requests,
    start_failure,
    time_limit_minutes,
    trim_pod,
    verified_gang,
)

WORKLOADS = WorkloadsConfig(namespaces={
    "team-alice": ManagedNamespace(user="alice", account="lab_alice", partition="k8s", accounts=("shared",),
                                   partitions=("sim",), time_limit_min=30),
})


def pod(name: str = "p", *, namespace: str = "team-alice", cpu: str = "500m", memory: str = "64Mi",
        owner: dict[str, Any] | None = None, labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None, status: dict[str, Any] | None = None,
        extra_spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "labels": labels or {},
                     "annotations": annotations or {}, "ownerReferences": [owner] if owner else [],
                     "creationTimestamp": "2026-12-05T05:00:00Z"},
        "spec": {"schedulerName": "slurm-k8s-bridge",
                 "securityContext": {"runAsUser": 2001, "runAsGroup": 2001},
                 "containers": [{"name": "main", "image": "busybox:1",
                                 "securityContext": {"allowPrivilegeEscalation": False},
                                 "resources": {"requests": {"cpu": cpu, "memory": memory},
                                               "limits": {"cpu": cpu, "memory": memory}}}],
                 **(extra_spec or {})},
        "status": status or {"phase": "Pending"},
    }


KEY = b"0123456789abcdef-step-key"
JOB_OWNER = {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "job-uid", "controller": True}


def test_the_pods_of_a_job_are_one_gang_sized_by_the_job() -> None:
    a, b = trim_pod(pod("a", owner=JOB_OWNER)), trim_pod(pod("b", owner=JOB_OWNER))
    assert a.gang == b.gang == "team-alice/job/job-uid"
    assert (a.kind, a.owner, a.gang_size) == ("Job", "train", None)  # read from the Job
    assert job_size({"spec": {"parallelism": 4, "completions": 10}, "status": {"succeeded": 8}}) == 2
    assert job_size({"spec": {"parallelism": 4}}) == 4
    assert job_size({"spec": {"parallelism": 2, "completions": 2}, "status": {"succeeded": 2}}) == 0


def test_a_group_label_makes_a_gang_of_its_size_and_a_pod_alone_is_its_own() -> None:
    grouped = trim_pod(pod("w0", labels={"slurm-k8s-bridge/gang": "ddp"},
                           annotations={"slurm-k8s-bridge/gang-size": "2"}))
    assert (grouped.gang, grouped.gang_size, grouped.kind) == ("team-alice/group/ddp", 2, "Group")
    unsized = trim_pod(pod("w1", labels={"slurm-k8s-bridge/gang": "ddp"},
                           annotations={"slurm-k8s-bridge/gang-size": "two"}))
    assert unsized.gang_size is None
    alone = trim_pod(pod("solo"))
    assert (alone.gang, alone.gang_size) == ("team-alice/pod/uid-solo", 1)
    # The same group name in another namespace is another gang.
    elsewhere = trim_pod(pod("w0", namespace="team-bob", labels={"slurm-k8s-bridge/gang": "ddp"}))
    assert elsewhere.gang != grouped.gang


def test_limits_count_as_the_scheduler_counts_requests() -> None:
    """What Slurm allocates is what the pod may use: its limits, its sidecars added, its largest other
    init container if larger, its overhead; a container without CPU and memory limits is refused."""
    def limited(cpu: str, memory: str, **more: Any) -> dict[str, Any]:
        return {"name": "c", "resources": {"limits": {"cpu": cpu, "memory": memory}}, **more}

    spec = {"containers": [limited("1500m", "1Gi"), limited("1", "512Mi")],
            "initContainers": [limited("4", "100M"), limited("500m", "10Mi", restartPolicy="Always")],
            "overhead": {"cpu": "250m", "memory": "1Mi"}}
    assert pod_requests(spec) == (4250, 2**30 + 512 * 2**20 + 10 * 2**20 + 2**20, 0)
    with pytest.raises(WorkloadError, match=r"must set resources\.limits for cpu and memory"):
        pod_requests({"containers": [{"name": "c",
                                      "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]})
    with pytest.raises(WorkloadError, match=r"asks for example\.com/fpga, which Slurm does not allocate"):
        pod_requests({"containers": [limited("1", "1Gi")
                                     | {"resources": {"limits": {"cpu": "1", "memory": "1Gi",
                                                                 "example.com/fpga": "1"}}}]})
    with pytest.raises(WorkloadError):
        pod_requests({"containers": [limited("lots", "1Gi")]})


def test_a_gang_becomes_one_job_of_one_task_per_pod_in_the_namespaces_account() -> None:
    pods = [trim_pod(pod(n, cpu=c, memory=m, owner=JOB_OWNER)) for n, c, m in
            (("a", "500m", "64Mi"), ("b", "1200m", "1Gi"))]
    job = job_request(pods, WORKLOADS, KEY)
    assert (job["account"], job["partition"]) == ("lab_alice", "k8s")
    assert (job["tasks"], job["cpus_per_task"]) == (2, 2)
    assert job["memory_per_cpu"]["number"] == 512  # the largest pod's 1 GiB over its 2 CPUs
    assert job["time_limit"]["number"] == 30  # the namespace's default
    assert job["name"] == "team-alice/train"
    assert job["requeue"] is False  # preempted: PREEMPTED, and the Job's new pods are a new job
    assert verified_gang(job["comment"], "alice", KEY) == "team-alice/job/job-uid"
    assert is_gang_script(job["script"]) and "#K8S image=busybox:1" in job["script"]


def test_a_pod_picks_only_an_allowed_account_or_partition() -> None:
    shared = trim_pod(pod(annotations={"slurm-k8s-bridge/account": "shared",
                                       "slurm-k8s-bridge/partition": "sim",
                                       "slurm-k8s-bridge/time-limit": "1:30:00"}))
    job = job_request([shared], WORKLOADS, KEY)
    assert (job["account"], job["partition"], job["time_limit"]["number"]) == ("shared", "sim", 90)
    with pytest.raises(WorkloadError, match="account 'lab_bob' is not allowed"):
        job_request([trim_pod(pod(annotations={"slurm-k8s-bridge/account": "lab_bob"}))], WORKLOADS, KEY)
    with pytest.raises(WorkloadError, match="partition 'native' is not allowed"):
        job_request([trim_pod(pod(annotations={"slurm-k8s-bridge/partition": "native"}))], WORKLOADS, KEY)
    with pytest.raises(WorkloadError, match="maps it to no Slurm user"):
        job_request([trim_pod(pod(namespace="team-eve"))], WORKLOADS, KEY)
    deadline = trim_pod(pod(extra_spec={"activeDeadlineSeconds": 61}))
    assert job_request([deadline], WORKLOADS, KEY)["time_limit"]["number"] == 2


def test_a_pod_picks_only_an_allowed_qos_whose_limits_then_apply() -> None:
    capped = WorkloadsConfig(namespaces={"team-alice": ManagedNamespace(
        user="alice", account="lab_alice", partition="k8s", qoses=("gpu2",))})
    assert "qos" not in job_request([trim_pod(pod())], capped, KEY)  # the user's default QOS
    picked = trim_pod(pod(annotations={"slurm-k8s-bridge/qos": "gpu2"}))
    assert job_request([picked], capped, KEY)["qos"] == "gpu2"
    with pytest.raises(WorkloadError, match="QOS 'high' is not allowed"):
        job_request([trim_pod(pod(annotations={"slurm-k8s-bridge/qos": "high"}))], capped, KEY)
    with pytest.raises(WorkloadError, match=r"QOS 'gpu2' is not allowed .*\(allowed: none\)"):
        job_request([picked], WORKLOADS, KEY)


def test_only_a_comment_the_bridge_signed_for_that_user_makes_a_job_a_gangs() -> None:
    """A user writes their job's comment (sbatch --comment, scontrol update): a forged one, one copied
    from another user's job, or one signed with another key names no gang."""
    first = trim_pod(pod())
    signed = gang_comment(first, "alice", KEY)
    assert verified_gang(signed, "alice", KEY) == first.gang
    assert verified_gang(signed, "bob", KEY) is None  # bob's job with alice's comment
    assert verified_gang(signed, "alice", b"another-key-of-16-bytes") is None
    forged = signed.replace(first.gang, "team-alice/group/other")
    assert verified_gang(forged, "alice", KEY) is None
    assert verified_gang(f"slurm-k8s-bridge workload {first.gang}", "alice", KEY) is None
    assert verified_gang(f"my job: {signed}", "alice", KEY) is None
    assert not is_gang_script("#!/bin/bash\necho hi\n")
    assert is_gang_script(gang_script(first))


@pytest.mark.parametrize(("text", "minutes"), [("90", 90), ("1:30", 2), ("1:30:00", 90), ("2-00", 2880),
                                               ("1-2:03", 1563), ("0:0:1", 1)])
def test_time_limits_read_as_slurms_time_option(text: str, minutes: int) -> None:
    assert time_limit_minutes(text) == minutes


@pytest.mark.parametrize("text", ["", "0", "soon", "1:2:3:4", "-5"])
def test_a_time_limit_slurm_would_not_read_is_refused(text: str) -> None:
    with pytest.raises(WorkloadError):
        time_limit_minutes(text)


def alloc(*nodes: tuple[str, int, int]) -> JobAllocation:
    return JobAllocation(job_id=7, state="RUNNING", nodes=tuple(NodeAllocation(n, c, m) for n, c, m in nodes))


def test_pods_go_where_slurms_allocation_holds_them_and_nowhere_else() -> None:
    pods = [trim_pod(pod(f"w{i}", cpu="2", memory="1Gi")) for i in range(3)]
    shape = task_shape(pods)
    placed = place(pods, alloc(("n1", 4, 2048), ("n2", 2, 1024)), shape)
    assert placed == {"w0": Placement("n1", ()), "w1": Placement("n1", ()), "w2": Placement("n2", ())}
    # Fewer CPUs (or memory) than the gang needs: no pod runs beyond what Slurm gave.
    assert isinstance(place(pods, alloc(("n1", 4, 2048), ("n2", 1, 1024)), shape), str)
    assert isinstance(place(pods, alloc(("n1", 4, 1024), ("n2", 2, 1024)), shape), str)
    # Slurm not tracking memory (0): CPUs decide.
    assert {name: p.node for name, p in place(pods, alloc(("n1", 6, 0)), shape).items()} == \
        {"w0": "n1", "w1": "n1", "w2": "n1"}


def ended(name: str, phase: str, code: int | None = None, reason: str = "") -> dict[str, Any]:
    statuses = [{"name": "main", "state": {"terminated": {"exitCode": code}}}] if code is not None else []
    return pod(name, status={"phase": phase, "containerStatuses": statuses, "reason": reason, "message": ""},
               extra_spec={"nodeName": "n1"})


def test_a_gang_ends_when_every_pod_has_with_the_highest_code() -> None:
    running = pod("b", status={"phase": "Running", "containerStatuses": [{"state": {"running": {}}}]})
    assert gang_outcome([trim_pod(ended("a", "Failed", 3)), trim_pod(running)]) is None
    end = gang_outcome([trim_pod(ended("a", "Failed", 3)), trim_pod(ended("b", "Succeeded", 0))])
    assert end is not None and (end.exit_code, end.reason) == (3, "")
    evicted = gang_outcome([trim_pod(ended("a", "Failed", reason="Evicted"))])
    assert evicted is not None and evicted.exit_code == 1 and "Evicted" in evicted.reason


def test_a_bound_pod_that_cannot_start_says_why() -> None:
    waiting = pod("a", extra_spec={"nodeName": "n1"}, status={"phase": "Pending", "containerStatuses": [
        {"state": {"waiting": {"reason": "ErrImagePull", "message": "no such image"}}}]})
    assert start_failure([trim_pod(waiting)]) == "team-alice/a: ErrImagePull: no such image"
    creating = pod("b", extra_spec={"nodeName": "n1"}, status={"phase": "Pending", "containerStatuses": [
        {"state": {"waiting": {"reason": "ContainerCreating"}}}]})
    assert start_failure([trim_pod(creating)]) is None


def test_slurmrestds_refusal_is_read_from_its_answer_or_a_quote_of_it() -> None:
    quoted = ('Data after `Connection: close`: b\'{\\n "errors": [{"description": "Batch job submission '
              'failed", "error": "Invalid account or account\\\\/partition combination specified"}]}')
    assert refusal_words(quoted) == "Invalid account or account/partition combination specified"
    answer = '{"job_submit_user_msg": "no image", "errors": [{"error": "Unspecified error"}]}'
    assert refusal_words(answer) == "no image; Unspecified error"


BASE = """cluster = "c"
[slurm]
url = "http://127.0.0.1:1"
token_file = "/etc/hostname"
[waiter]
step_key_file = "/etc/hostname"
[partitions.k8s]
"""


def test_a_managed_namespace_needs_a_bridged_partition_and_slurmrestd() -> None:
    good = BASE + '[workloads.namespaces.team-alice]\nuser = "alice"\naccount = "a"\npartition = "k8s"\n'
    assert parse_config(good).workloads.allowed_partitions("team-alice") == ("k8s",)
    with pytest.raises(ConfigError, match="partition 'gpu' is not bridged"):
        parse_config(good.replace('partition = "k8s"', 'partition = "gpu"'))
    with pytest.raises(ConfigError, match='backend = "rest"'):
        parse_config(good.replace("[slurm]\n", '[slurm]\nbackend = "pyslurm"\n'))
    with pytest.raises(ConfigError, match="job namespace"):
        parse_config(good.replace("team-alice", "slurm-jobs"))
    with pytest.raises(ConfigError, match="step_key_file"):
        parse_config(good.replace('step_key_file = "/etc/hostname"\n', ""))
    with pytest.raises(ConfigError, match="may act for every user"):
        parse_config(good.replace('user = "alice"', 'user = "root"'))


@pytest.mark.parametrize(("spec", "problem"), [
    ({"hostNetwork": True}, "spec.hostNetwork"),
    ({"hostPID": True}, "spec.hostPID"),
    ({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}, "hostPath volume root"),
    ({"securityContext": {"runAsUser": 2001, "runAsGroup": 2001, "supplementalGroups": [0]}}, "group 0"),
    ({"securityContext": {}}, "must set runAsUser and runAsGroup"),
    ({"volumes": [{"name": "data", "nfs": {"server": "x", "path": "/"}}]}, "nfs volume data"),
    ({"securityContext": {"runAsUser": 2001, "runAsGroup": 2001, "seccompProfile": {"type": "Unconfined"}}},
     "without seccomp"),
    ({"securityContext": {"runAsUser": 0, "runAsGroup": 0}}, "must set runAsUser and runAsGroup"),
])
def test_a_pod_that_could_act_beyond_its_user_never_becomes_a_job(spec: dict[str, Any], problem: str) -> None:
    unsafe = trim_pod(pod(extra_spec=spec))
    with pytest.raises(WorkloadError, match="cannot run as a Slurm job's task") as refused:
        job_request([unsafe], WORKLOADS, KEY)
    assert problem in str(refused.value)


@pytest.mark.parametrize("change", [{"privileged": True}, {"allowPrivilegeEscalation": True},
                                    {"allowPrivilegeEscalation": None},
                                    {"capabilities": {"add": ["SYS_ADMIN"]}}, {"runAsUser": 0}])
def test_a_container_that_escalates_or_is_root_is_refused(change: dict[str, Any]) -> None:
    spec = pod()["spec"]
    context = {**spec["containers"][0]["securityContext"], **change}
    spec["containers"][0]["securityContext"] = {k: v for k, v in context.items() if v is not None}
    assert trim_pod({**pod(), "spec": spec}).unsafe
    assert trim_pod(pod()).unsafe == ""


@pytest.mark.parametrize(("change", "problem"), [
    ({"ports": [{"containerPort": 22, "hostPort": 2222}]}, "hostPort"),
    ({"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}, "NVIDIA_VISIBLE_DEVICES"),
])
def test_a_container_reaching_the_nodes_ports_or_gpus_is_refused(
        change: dict[str, Any], problem: str) -> None:
    spec = pod()["spec"]
    spec["containers"][0].update(change)
    assert problem in trim_pod({**pod(), "spec": spec}).unsafe


def test_every_container_runs_as_the_slurm_jobs_user_or_the_job_fails() -> None:
    own = trim_pod(pod())
    assert foreign_ids(own, 2001, 2001) == "" and own.unsafe == ""
    spec = pod()["spec"]
    spec["initContainers"] = [{"name": "init", "image": "i", "securityContext": {"runAsUser": 2002}}]
    other = trim_pod({**pod(), "spec": spec})
    assert "runs as 2002:2001, not as the Slurm job's user 2001:2001" in foreign_ids(other, 2001, 2001)
    spec = pod()["spec"]
    spec["securityContext"] |= {"supplementalGroups": [2002], "fsGroup": 2001}
    assert "group 2002" in foreign_ids(trim_pod({**pod(), "spec": spec}), 2001, 2001)
