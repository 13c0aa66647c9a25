"""With `[pods] agent_image`, pod 0 runs the script through the in-pod agent and the other pods
hold their node with `agent wait`; an init container installs the agent. The daemon turns the
agent's frames into the waiter's "out" events, only pod 0's end decides the job, and the waiter
writes the bytes to fd 1 or 2, knowing whether the two are one file."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bridge.controller.log_relay import output_event as _output_event
from bridge.core import wellknown
from bridge.core.config import PartitionConfig, PodsConfig, parse_config
from bridge.core.directives import Directives
from bridge.core.model import NodeAllocation
from bridge.core.outcome import FailedBeforeStart, Finished, Running, job_outcome
from bridge.core.translate import desired_pods

from .builders import allocation, config, payload
from .waiter_runs import shared_go_test_binary

AGENT = "/slurm-k8s-bridge-bin/slurm-k8s-bridge-agent"
PIDFILE = "/slurm-k8s-bridge-bin/script.pid"
SCRIPT_PATH = "/slurm-k8s-bridge/slurm_script"
AGENT_IMAGE = "reg.example/slurm-k8s-bridge-agent:1"
THREE_NODES = (
    NodeAllocation("kube1", cpus=2, memory_mb=1024, gpu_indices=()),
    NodeAllocation("kube2", cpus=1, memory_mb=512, gpu_indices=()),
    NodeAllocation("kube3", cpus=4, memory_mb=256, gpu_indices=()),
)


def agent_config(pull_policy: str = "IfNotPresent", **changes: Any) -> Any:
    pods_config = PodsConfig(supplemental_groups_policy="", agent_image=AGENT_IMAGE,
                             agent_pull_policy=pull_policy)
    return config(pods=pods_config, **changes)


def pods(cfg: Any = None, part: PartitionConfig | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    return desired_pods(
        kwargs.pop("alloc", allocation(nodes=THREE_NODES)),
        kwargs.pop("payload", payload()),
        Directives(image="debian:12"),
        part or PartitionConfig(),
        cfg if cfg is not None else agent_config(),
        **kwargs,
    )


def job(pod: dict[str, Any]) -> dict[str, Any]:
    (only,) = pod["spec"]["containers"]
    return only


# -- (a) translate ----------------------------------------------------------------------------


@pytest.mark.parametrize(("merged", "mode"), [(True, "merged"), (False, "split")])
def test_pod_0_runs_the_script_through_the_agent(merged: bool, mode: str) -> None:
    first = pods(payload=payload(output_merged=merged))[0]
    assert job(first)["command"] == [AGENT, "run", PIDFILE, mode, "--", "/bin/bash", SCRIPT_PATH]


@pytest.mark.parametrize(
    ("script", "interpreter"),
    [
        ("#!/usr/bin/env python3\nprint(1)\n", ["/usr/bin/env", "python3"]),
        ("#!/bin/sh -e\n", ["/bin/sh", "-e"]),
        ("#!/opt/$x/sh\n", ["/opt/$$x/sh"]),  # still protected from the kubelet's $(VAR) expansion
    ],
)
def test_the_agent_runs_the_shebangs_interpreter(script: str, interpreter: list[str]) -> None:
    first = pods(payload=payload(script=script))[0]
    assert job(first)["command"] == [AGENT, "run", PIDFILE, "merged", "--", *interpreter, SCRIPT_PATH]


def test_the_other_pods_hold_their_node_with_wait() -> None:
    result = pods()
    assert [job(p)["command"] for p in result[1:]] == [[AGENT, "wait"], [AGENT, "wait"]]


def test_no_pod_carries_the_script() -> None:
    """Issue 11: a script (up to 240 KB) in a pod is in etcd and in every watch event of that pod;
    it is in the run's Secret instead, with or without the agent."""
    for cfg in (None, config()):
        for pod in pods(cfg=cfg) if cfg else pods():
            assert wellknown.ANNOTATION_SCRIPT not in pod["metadata"]["annotations"]
            assert payload().script not in json.dumps(pod)


def test_an_init_container_installs_the_agent_as_the_job_with_the_same_resources() -> None:
    for pod in pods(cfg=agent_config("Always")):
        container = job(pod)
        assert pod["spec"]["initContainers"] == [
            {
                "name": "slurm-k8s-bridge-agent",
                "image": AGENT_IMAGE,
                "imagePullPolicy": "Always",
                "command": ["/slurm-k8s-bridge-agent", "install", AGENT],
                "resources": container["resources"],
                "securityContext": container["securityContext"],
                "volumeMounts": [{"name": wellknown.AGENT_VOLUME, "mountPath": wellknown.AGENT_DIR}],
            }
        ]
        assert container["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "capabilities": {"drop": ["ALL"]},
        }


def test_the_init_container_gets_the_lowered_cpu_request_too() -> None:
    part = PartitionConfig(cpu_request_fraction=0.25)
    (first, *_) = pods(part=part, cfg=agent_config(partitions={"k8s": part}))
    init = first["spec"]["initContainers"][0]
    assert init["resources"] == job(first)["resources"] == {
        "requests": {"cpu": "500m", "memory": "1024Mi"},
        "limits": {"cpu": "2", "memory": "1024Mi"},
    }


def test_the_agent_volume_is_an_empty_dir_mounted_writable_in_both_containers() -> None:
    for pod in pods():
        volumes = [v for v in pod["spec"]["volumes"] if v["name"] == wellknown.AGENT_VOLUME]
        assert len(volumes) == 1
        assert "emptyDir" in volumes[0]
        mount = {"name": wellknown.AGENT_VOLUME, "mountPath": "/slurm-k8s-bridge-bin"}
        assert mount in job(pod)["volumeMounts"], "the job container runs the agent and writes its pid file"
        assert pod["spec"]["initContainers"][0]["volumeMounts"] == [mount]
        script_mount = {"name": wellknown.SCRIPT_VOLUME, "mountPath": wellknown.SCRIPT_DIR, "readOnly": True}
        assert script_mount in job(pod)["volumeMounts"]


def test_agent_pods_are_marked_framed_and_keep_a_file_termination_message() -> None:
    for pod in pods():
        assert pod["metadata"]["annotations"]["slurm-k8s-bridge/output"] == "framed"
        assert job(pod)["terminationMessagePolicy"] == "File"


def test_the_agent_image_is_read_from_the_pods_table() -> None:
    text = (
        'cluster = "sandbox"\n[slurm]\nurl = "http://127.0.0.1:6820"\n[partitions.k8s]\n'
        f'[pods]\nsupplemental_groups_policy = ""\nagent_image = "{AGENT_IMAGE}"\n'
    )
    cfg = parse_config(text)
    (first, second, _) = pods(cfg=cfg)

    assert first["spec"]["initContainers"][0]["image"] == AGENT_IMAGE
    assert first["spec"]["initContainers"][0]["imagePullPolicy"] == "IfNotPresent"
    assert job(first)["command"][:2] == [AGENT, "run"]
    assert job(second)["command"] == [AGENT, "wait"]


def test_without_an_agent_image_every_pod_runs_the_script_itself() -> None:
    for pod in pods(cfg=config()):
        assert "initContainers" not in pod["spec"]
        assert job(pod)["command"] == ["/bin/bash", SCRIPT_PATH]
        assert job(pod)["terminationMessagePolicy"] == "FallbackToLogsOnError"
        assert "slurm-k8s-bridge/output" not in pod["metadata"]["annotations"]
        assert wellknown.AGENT_VOLUME not in {v["name"] for v in pod["spec"]["volumes"]}
        assert wellknown.AGENT_VOLUME not in {m["name"] for m in job(pod)["volumeMounts"]}


# -- (b) frames become the waiter's events ----------------------------------------------------

STAMP = "2025-12-01T12:00:00.123456789Z"


@pytest.mark.parametrize(("tag", "fd"), [("o", 1), ("e", 2)])
@pytest.mark.parametrize("data", [base64.b64encode(bytes(range(256))).decode(), "", "not base64 at all!"])
def test_a_frame_goes_to_its_fd_with_its_data_unchanged(tag: str, fd: int, data: str) -> None:
    assert _output_event(3, STAMP, f"{tag} {data}") == {
        "type": "out", "pod": 3, "ts": STAMP, "fd": fd, "data": data,
    }


@pytest.mark.parametrize(
    "line",
    [
        'slurm-k8s-bridge-agent: cannot run /bin/bash: fork/exec /bin/bash: no such file or directory',
        "o",  # a tag without a space is no frame
        "e",
        "",
        "O aGkK",
        "oo aGkK",
        " o aGkK",
        "q aGkK",
        "panic: runtime error \udcff",  # undecodable bytes as the log reader gives them back
    ],
)
def test_any_other_line_is_text_for_stderr_with_its_newline(line: str) -> None:
    event = _output_event(0, STAMP, line)
    assert {k: v for k, v in event.items() if k != "data"} == {"type": "out", "pod": 0, "ts": STAMP, "fd": 2}
    assert base64.b64decode(event["data"], validate=True) == line.encode("utf-8", "surrogateescape") + b"\n"


# -- (c) the first pod decides -----------------------------------------------------------------

NOW = datetime(2025, 12, 1, 12, 0, 0, tzinfo=UTC)
RECENT = (NOW - timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
LONG_AGO = (NOW - timedelta(seconds=300)).strftime("%Y-%m-%dT%H:%M:%SZ")


def agent_pod(index: int, phase: str, state: dict[str, Any], *, started: str = RECENT,
              init: dict[str, Any] | None = None, reason: str = "") -> dict[str, Any]:
    status: dict[str, Any] = {
        "phase": phase, "startTime": started,
        "containerStatuses": [{"name": "job", "image": "debian:12", "state": state}],
        "initContainerStatuses": [{
            "name": "slurm-k8s-bridge-agent", "image": AGENT_IMAGE,
            "state": init if init is not None else {"terminated": {"exitCode": 0, "reason": "Completed"}},
        }],
    }
    if reason:
        status["reason"] = reason
    return {
        "metadata": {
            "name": f"slurm-9-{index}",
            "annotations": {"slurm-k8s-bridge/node-index": str(index), "slurm-k8s-bridge/output": "framed"},
            "creationTimestamp": started,
        },
        "spec": {"containers": [{"name": "job", "image": "debian:12"}]},
        "status": status,
    }


def running(index: int) -> dict[str, Any]:
    return agent_pod(index, "Running", {"running": {"startedAt": RECENT}})


def exited(index: int, code: int) -> dict[str, Any]:
    term = {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}
    return agent_pod(index, "Succeeded" if code == 0 else "Failed", {"terminated": term})


def outcome(*observed: dict[str, Any], nodes: int = 3) -> Any:
    return job_outcome(list(observed), nodes, now=NOW, batch_only=True)


def test_the_job_ends_as_soon_as_the_first_pod_ends() -> None:
    assert outcome(exited(0, 0), running(1), running(2)) == Finished(0)
    assert isinstance(job_outcome([exited(0, 0), running(1), running(2)], 3, now=NOW), Running), \
        "without batch_only every pod must end"


def test_the_first_pods_exit_code_is_the_jobs() -> None:
    assert outcome(exited(0, 3), running(1), running(2)) == Finished(3, None, "slurm-9-0: exited with code 3")


def test_the_waiting_pods_end_decides_nothing() -> None:
    """A `wait` pod stopped (or killed) while the script runs does not end the job, nor does its
    code outweigh the script's."""
    assert isinstance(outcome(running(0), exited(1, 143), exited(2, 1)), Running)
    assert outcome(exited(0, 0), exited(1, 143), exited(2, 137)) == Finished(0)


def test_nothing_is_decided_before_the_first_pod_is_seen() -> None:
    assert isinstance(outcome(exited(1, 0), exited(2, 0)), Running)


def test_another_pod_that_cannot_start_still_fails_the_job() -> None:
    refused = agent_pod(2, "Failed", {"waiting": {"reason": "PodInitializing"}}, init={"waiting": {}},
                        reason="OutOfcpu")
    result = outcome(running(0), running(1), refused)
    assert isinstance(result, FailedBeforeStart)
    assert result.reason.startswith("slurm-9-2: ")

    never_pulled = agent_pod(1, "Pending", {"waiting": {"reason": "ErrImageNeverPull", "message": "no"}})
    result = outcome(running(0), never_pulled, running(2))
    assert isinstance(result, FailedBeforeStart)
    assert result.reason.startswith("slurm-9-1: cannot pull image")


@pytest.mark.parametrize("index", [0, 1])
@pytest.mark.parametrize(
    ("init", "explained"),
    [
        ({"terminated": {"exitCode": 2, "reason": "Error", "message": "install: no space left on device\n"}},
         "Error: install: no space left on device"),
        ({"terminated": {"exitCode": 1}}, "exit code 1"),
    ],
)
def test_a_failed_init_container_is_blamed_on_the_agent(
    index: int, init: dict[str, Any], explained: str
) -> None:
    broken = agent_pod(index, "Failed", {"waiting": {"reason": "PodInitializing"}}, init=init)
    others = [running(i) for i in range(3) if i != index]

    result = outcome(broken, *others)

    assert isinstance(result, FailedBeforeStart)
    assert "agent" in result.reason
    assert result.reason == f"slurm-9-{index}: the bridge's agent could not be set up: {explained}"


# -- (d) the waiter writes what the pods wrote ---------------------------------------------------
# The compiled waiter's output functions (agent/internal/waiter/output.go), in its test program
# (output_test.go) run with the fds slurmstepd would give it.


@pytest.fixture(scope="module")
def output_program() -> list[str]:
    return [str(shared_go_test_binary()), "-test.run", "^TestOutputAsTheJobSeesIt$"]


def waiter_output(program: list[str], case: str, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(program, env={**os.environ, "WAITER_OUTPUT_CASE": case}, timeout=60, check=False,
                          **kwargs)


def merged_seen(program: list[str], stdout: Any, stderr: Any) -> int:
    return waiter_output(program, "merged", stdout=stdout, stderr=stderr).returncode


def test_one_file_for_stdout_and_stderr_is_merged(output_program: list[str], tmp_path: Path) -> None:
    with open(tmp_path / "slurm-1.out", "wb") as out:
        assert merged_seen(output_program, out, subprocess.STDOUT) == 10


def test_the_same_file_opened_twice_is_merged(output_program: list[str], tmp_path: Path) -> None:
    """-o and -e naming one file: slurmstepd opens it twice, the inode is the same."""
    with open(tmp_path / "slurm-1.out", "ab") as out, open(tmp_path / "slurm-1.out", "ab") as err:
        assert merged_seen(output_program, out, err) == 10


def test_two_files_are_not_merged(output_program: list[str], tmp_path: Path) -> None:
    with open(tmp_path / "slurm-1.out", "wb") as out, open(tmp_path / "slurm-1.err", "wb") as err:
        assert merged_seen(output_program, out, err) == 20


def test_write_all_writes_every_byte_to_pipes_in_order(output_program: list[str], tmp_path: Path) -> None:
    """The pipe is non-blocking and read slowly: a write takes only what it has room for, often
    nothing (EAGAIN), and only a loop over partial writes gets every byte out, in order."""
    reader, writer = os.pipe()
    os.set_blocking(writer, False)
    fd3 = tmp_path / "fd3"
    # A file open on fd 3 too, which the waiter must leave alone.
    with os.fdopen(reader, "rb", buffering=0) as source, subprocess.Popen(
        ["sh", "-c", 'exec "$@" 3>"$FD3"', "sh", *output_program],
        env={**os.environ, "WAITER_OUTPUT_CASE": "in-order", "FD3": str(fd3)},
        stdout=writer, stderr=subprocess.PIPE,
    ) as proc:
        os.close(writer)
        received = bytearray()
        while chunk := source.read(1000):
            received += chunk
            time.sleep(0.0005)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert bytes(received) == b"text first|" + bytes(range(256)) * 4096 + b"|no newline"
    assert stderr == b"err\x00\xff"
    assert fd3.exists() and fd3.read_bytes() == b"", "a fd that is not the job's is never written"


def test_write_all_fills_a_pipe_beyond_its_buffer(output_program: list[str]) -> None:
    reader, writer = os.pipe()
    with os.fdopen(reader, "rb") as source:
        proc = subprocess.Popen(output_program, env={**os.environ, "WAITER_OUTPUT_CASE": "fill"},
                                stdout=writer)
        os.close(writer)
        data = source.read()
    assert proc.wait(timeout=60) == 0
    assert data == b"z" * 4_000_000
