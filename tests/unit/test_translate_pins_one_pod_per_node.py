"""An allocation becomes one deterministic pod per node, pinned to that node and run as the user."""

from __future__ import annotations

import re
from typing import Any

import pytest

from bridge.core import wellknown
from bridge.core.config import PartitionConfig, VolumeConfig
from bridge.core.directives import Directives
from bridge.core.model import NodeAllocation
from bridge.core.pod_identity import job_id_of, node_index_of, pod_name, run_of
from bridge.core.translate import (
    MAX_SCRIPT_BYTES,
    TranslateError,
    desired_pods,
    resolve_image,
)

from .builders import allocation, config, payload

IMAGE = Directives(image="debian:12")


def pods(
    directives: Directives = IMAGE, part: PartitionConfig | None = None, **kwargs: Any
) -> list[dict[str, Any]]:
    return desired_pods(
        kwargs.pop("alloc", allocation()),
        kwargs.pop("payload", payload()),
        directives,
        part or PartitionConfig(),
        kwargs.pop("cfg", config()),
        **kwargs,
    )


def container(pod: dict[str, Any]) -> dict[str, Any]:
    (only,) = pod["spec"]["containers"]
    return only


def test_one_pod_per_node_in_node_order() -> None:
    result = pods()
    assert [p["metadata"]["name"] for p in result] == ["slurm-42-0", "slurm-42-1"]
    assert [p["spec"]["nodeName"] for p in result] == ["kube1", "kube2"]
    assert {p["metadata"]["namespace"] for p in result} == {"slurm-jobs"}


def test_a_requeued_run_gets_pod_names_and_a_label_of_its_own() -> None:
    rerun = pods(alloc=allocation(run=2))

    assert [p["metadata"]["name"] for p in rerun] == ["slurm-42-r2-0", "slurm-42-r2-1"]
    assert {p["metadata"]["labels"]["slurm-k8s-bridge/run"] for p in rerun} == {"2"}
    assert {run_of(p) for p in rerun} == {2}
    assert run_of({"metadata": {"labels": {}}}) == 0, "pods from before runs were labelled are run 0"


def test_first_pod_manifest() -> None:
    pod = pods()[0]
    secret = pod["metadata"]["annotations"]["slurm-k8s-bridge/payload-secret"]
    assert re.fullmatch(r"slurm-payload-[0-9a-f]{32}", secret)
    assert pod["apiVersion"] == "v1"
    assert pod["kind"] == "Pod"
    assert pod["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "slurm-k8s-bridge",
        "slurm-k8s-bridge/cluster": "sandbox",
        "slurm-k8s-bridge/job-id": "42",
        "slurm-k8s-bridge/run": "0",
    }
    assert pod["metadata"]["annotations"] == {
        "slurm-k8s-bridge/node-index": "0",
        "slurm-k8s-bridge/node-count": "2",
        "slurm-k8s-bridge/slurm-node": "kube1",
        "slurm-k8s-bridge/user": "alice",
        "slurm-k8s-bridge/payload-secret": secret,
    }
    spec = pod["spec"]
    assert {k: v for k, v in spec.items() if k not in ("containers", "volumes")} == {
        "nodeName": "kube1",
        "hostname": "kube1",
        "restartPolicy": "Never",
        "shareProcessNamespace": True,
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 10,
        "securityContext": {
            "runAsUser": 1000,
            "runAsGroup": 100,
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "tolerations": [{"key": "slurm-k8s-bridge/bridged", "operator": "Exists", "effect": "NoSchedule"}],
    }
    assert spec["volumes"] == [
        {
            "name": "slurm-k8s-bridge-script",
            "secret": {
                "secretName": secret,
                "defaultMode": 0o444,
                "items": [{"key": "SLURM_K8S_BRIDGE_SCRIPT", "path": "slurm_script"}],
            },
        }
    ]
    c = container(pod)
    assert {k: v for k, v in c.items() if k != "env"} == {
        "name": "job",
        "image": "debian:12",
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/bash", "/slurm-k8s-bridge/slurm_script"],
        "workingDir": "/home/alice/run",
        "envFrom": [{"secretRef": {"name": secret}}],
        "resources": {
            "requests": {"cpu": "2", "memory": "1024Mi"},
            "limits": {"cpu": "2", "memory": "1024Mi"},
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "slurm-k8s-bridge-script", "mountPath": "/slurm-k8s-bridge", "readOnly": True}
        ],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def test_same_input_same_manifests() -> None:
    env = {"B": "2", "A": "1", "C": "3"}
    reordered = dict(reversed(list(env.items())))
    assert pods(payload=payload(environment=env)) == pods(payload=payload(environment=reordered))


@pytest.mark.parametrize(
    ("directives", "part", "image", "policy"),
    [
        (Directives(image="a:1"), PartitionConfig(default_image="b:2"), "a:1", "IfNotPresent"),
        (Directives(), PartitionConfig(default_image="b:2", image_pull_policy="Never"), "b:2", "Never"),
        (
            Directives(image="a:1", pull_policy="Always"),
            PartitionConfig(image_pull_policy="Never"),
            "a:1",
            "Always",
        ),
    ],
)
def test_image_and_pull_policy_precedence(
    directives: Directives, part: PartitionConfig, image: str, policy: str
) -> None:
    c = container(pods(directives, part)[0])
    assert (c["image"], c["imagePullPolicy"]) == (image, policy)


def test_missing_image_tells_how_to_add_one() -> None:
    with pytest.raises(TranslateError, match="#K8S image=IMAGE"):
        resolve_image(Directives(), PartitionConfig())


@pytest.mark.parametrize(
    ("script", "command"),
    [
        ("#!/usr/bin/env python3\nprint(1)\n", ["/usr/bin/env", "python3", "/slurm-k8s-bridge/slurm_script"]),
        ("#!/bin/sh -e\n", ["/bin/sh", "-e", "/slurm-k8s-bridge/slurm_script"]),
        ("#!/opt/$x/sh\n", ["/opt/$$x/sh", "/slurm-k8s-bridge/slurm_script"]),
    ],
)
def test_command_runs_the_script_with_its_shebang(script: str, command: list[str]) -> None:
    assert container(pods(payload=payload(script=script))[0])["command"] == command


def test_directives_add_workdir_and_shm() -> None:
    pod = pods(Directives(image="x", workdir="/work", shm_size="2Gi"))[0]
    c = container(pod)
    assert c["workingDir"] == "/work"
    assert pod["spec"]["volumes"][-1] == {
        "name": "slurm-k8s-bridge-shm",
        "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"},
    }
    assert c["volumeMounts"][-1] == {"name": "slurm-k8s-bridge-shm", "mountPath": "/dev/shm"}


def test_partition_volumes_are_host_directories() -> None:
    part = PartitionConfig(
        volumes=(VolumeConfig("home", "/home", "/home"), VolumeConfig("d", "/srv", "/data", True))
    )
    pod = pods(part=part)[0]
    assert pod["spec"]["volumes"][1:] == [
        {"name": "home", "hostPath": {"path": "/home", "type": "Directory"}},
        {"name": "d", "hostPath": {"path": "/srv", "type": "Directory"}},
    ]
    assert container(pod)["volumeMounts"][1:] == [
        {"name": "home", "mountPath": "/home", "readOnly": False},
        {"name": "d", "mountPath": "/data", "readOnly": True},
    ]


@pytest.mark.parametrize(
    ("gpu_mode", "resources"),
    [
        ("env", {"cpu": "2", "memory": "1024Mi"}),
        ("device-plugin", {"cpu": "2", "memory": "1024Mi", "nvidia.com/gpu": "2"}),
    ],
)
def test_gpu_mode_decides_the_gpu_request(gpu_mode: str, resources: dict[str, str]) -> None:
    first, second = pods(part=PartitionConfig(gpu_mode=gpu_mode))
    assert container(first)["resources"] == {"requests": resources, "limits": resources}
    assert wellknown.GPU_RESOURCE not in container(second)["resources"]["limits"]


def test_unknown_cpu_and_memory_request_nothing() -> None:
    alloc = allocation(nodes=(NodeAllocation("kube1", cpus=0, memory_mb=0),))
    assert container(pods(alloc=alloc)[0])["resources"] == {"requests": {}, "limits": {}}


def test_partition_options_reach_the_spec() -> None:
    extra = {"key": "gpu", "operator": "Exists"}
    part = PartitionConfig(host_network=True, runtime_class="nvidia", tolerations=(extra,))
    spec = pods(part=part, cfg=config(termination_grace_s=30, namespace="jobs"))[0]["spec"]
    assert (spec["hostNetwork"], spec["dnsPolicy"], spec["runtimeClassName"]) == (
        True,
        "ClusterFirstWithHostNet",
        "nvidia",
    )
    assert "hostname" not in spec  # the node's own hostname applies on the host network
    assert spec["tolerations"][1] == extra
    assert spec["terminationGracePeriodSeconds"] == 30


def test_a_time_limited_job_has_no_pod_deadline_so_a_raised_limit_is_kept() -> None:
    """Kubernetes only lets activeDeadlineSeconds shrink; Slurm lets an admin raise TimeLimit of a
    running job. Slurm enforces the limit, so the pod carries none."""
    spec = pods(alloc=allocation(time_limit_s=600))[0]["spec"]
    assert "activeDeadlineSeconds" not in spec


def test_unlimited_job_has_no_deadline_and_odd_node_names_no_hostname() -> None:
    alloc = allocation(time_limit_s=None, nodes=(NodeAllocation("Node_1", 1, 1),))
    spec = pods(alloc=alloc)[0]["spec"]
    assert "activeDeadlineSeconds" not in spec
    assert "hostname" not in spec


def test_array_task_is_labelled_with_its_array() -> None:
    pod = pods(alloc=allocation(job_id=77, array_job_id=70, array_task_id=7))[0]
    assert pod["metadata"]["name"] == "slurm-77-0"
    assert pod["metadata"]["labels"]["slurm-k8s-bridge/array-job-id"] == "70"


def test_node_label_mapping() -> None:
    part = PartitionConfig(node_label="example.org/slurm-node")
    result = pods(part=part, k8s_nodes={"kube1": "k8s-a", "kube2": "k8s-b"})
    assert [p["spec"]["nodeName"] for p in result] == ["k8s-a", "k8s-b"]
    with pytest.raises(TranslateError, match=r"no Kubernetes node has label example\.org/slurm-node=kube2"):
        pods(part=part, k8s_nodes={"kube1": "k8s-a"})


def test_without_node_label_the_mapping_is_ignored() -> None:
    assert pods(k8s_nodes={"kube1": "other"})[0]["spec"]["nodeName"] == "kube1"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"alloc": allocation(uid=0, gid=0)}, r"root \(uid 0\)"),
        ({"alloc": allocation(uid=None)}, "did not report the uid/gid"),
        ({"payload": payload(uid=1001)}, "payload identity 1001:100 differs from job 42's 1000:100"),
        ({"payload": payload(gid=0)}, "differs"),
        ({"alloc": allocation(nodes=())}, "no allocated nodes"),
        ({"payload": payload(script="#!/bin/sh\n" + "x" * MAX_SCRIPT_BYTES)}, "at most"),
        ({"payload": payload(script="#!/bin/sh\necho \udcff\n")}, "not valid UTF-8"),
    ],
)
def test_untranslatable_jobs_raise(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(TranslateError, match=message):
        pods(**kwargs)


def test_names_and_ids_round_trip() -> None:
    pod = pods()[1]
    assert pod_name(42, 1) == pod["metadata"]["name"]
    assert (job_id_of(pod), node_index_of(pod)) == (42, 1)


@pytest.mark.parametrize(
    "pod",
    [
        {},
        {"metadata": None},
        {"metadata": {"labels": {"slurm-k8s-bridge/job-id": "abc"}}},
        {"metadata": {"labels": {"slurm-k8s-bridge/job-id": "-1"}}},
        {"metadata": {"labels": {"other": "1"}}},
    ],
)
def test_job_id_of_foreign_pods_is_none(pod: dict[str, Any]) -> None:
    assert job_id_of(pod) is None
    assert node_index_of(pod) is None


def test_a_cpu_request_fraction_lowers_requests_but_keeps_the_limit() -> None:
    alloc = allocation(nodes=(NodeAllocation("n1", cpus=3, memory_mb=2048, gpu_indices=()),))
    part = PartitionConfig(default_image="img:1", cpu_request_fraction=0.1)

    (pod,) = desired_pods(alloc, payload(), Directives(), part, config(partitions={"p": part}))
    resources = pod["spec"]["containers"][0]["resources"]

    assert resources["limits"] == {"cpu": "3", "memory": "2048Mi"}
    assert resources["requests"] == {"cpu": "300m", "memory": "2048Mi"}
