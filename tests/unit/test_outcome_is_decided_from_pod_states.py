"""The job outcome (running / finished / failed before start) follows from its pods' states."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from bridge.core.outcome import FailedBeforeStart, Finished, Outcome, Running, job_outcome, pod_view

NOW = datetime(2025, 12, 1, 12, 0, 0, tzinfo=UTC)
RECENT = (NOW - timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
LONG_AGO = (NOW - timedelta(seconds=300)).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(
    index: int = 0,
    phase: str = "Running",
    state: dict[str, Any] | None = None,
    *,
    reason: str | None = None,
    message: str | None = None,
    started: str = RECENT,
    deleting: bool = False,
    conditions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "startTime": started}
    if reason:
        status["reason"] = reason
    if message:
        status["message"] = message
    if state is not None:
        status["containerStatuses"] = [{"name": "job", "image": "reg.io/app:1", "state": state}]
    if conditions:
        status["conditions"] = conditions
    meta: dict[str, Any] = {
        "name": f"slurm-9-{index}",
        "annotations": {"slurm-k8s-bridge/node-index": str(index)},
        "creationTimestamp": started,
    }
    if deleting:
        meta["deletionTimestamp"] = RECENT
    return {
        "metadata": meta,
        "spec": {"containers": [{"name": "job", "image": "reg.io/app:1"}]},
        "status": status,
    }


def running(index: int = 0) -> dict[str, Any]:
    return pod(index, "Running", {"running": {"startedAt": RECENT}})


def exited(index: int, code: int, reason: str = "Error", **kwargs: Any) -> dict[str, Any]:
    phase = "Succeeded" if code == 0 else "Failed"
    term = {"exitCode": code, "reason": "Completed" if code == 0 else reason, **kwargs}
    return pod(index, phase, {"terminated": term})


def waiting(reason: str, started: str = RECENT, message: str = "boom") -> dict[str, Any]:
    return pod(0, "Pending", {"waiting": {"reason": reason, "message": message}}, started=started)


CASES: list[tuple[str, list[dict[str, Any]], int, Outcome]] = [
    ("no pods yet", [], 2, Running("0 of 2 pods exist")),
    (
        "starting",
        [pod(0, "Pending", {"waiting": {"reason": "ContainerCreating"}})],
        1,
        Running("slurm-9-0: ContainerCreating"),
    ),
    ("running", [running()], 1, Running("slurm-9-0: Running")),
    ("one of two created", [exited(0, 0)], 2, Running("1 of 2 pods exist")),
    ("success", [exited(0, 0)], 1, Finished(0)),
    ("all succeed", [exited(0, 0), exited(1, 0)], 2, Finished(0)),
    ("succeeded without status", [pod(0, "Succeeded")], 1, Finished(0)),
    ("exit code", [exited(0, 3)], 1, Finished(3, None, "slurm-9-0: exited with code 3")),
    (
        "highest exit code wins",
        [exited(0, 2), exited(1, 7), exited(2, 0)],
        3,
        Finished(7, None, "slurm-9-1: exited with code 7"),
    ),
    (
        "first failure decides",
        [running(0), exited(1, 1)],
        2,
        Finished(1, None, "slurm-9-1: exited with code 1"),
    ),
    ("SIGKILL as 137", [exited(0, 137)], 1, Finished(137, 9, "slurm-9-0: killed by signal 9 (SIGKILL)")),
    ("SIGTERM as 143", [exited(0, 143)], 1, Finished(143, 15, "slurm-9-0: killed by signal 15 (SIGTERM)")),
    (
        "signal field",
        [exited(0, 1, signal=11)],
        1,
        Finished(1, 11, "slurm-9-0: killed by signal 11 (SIGSEGV)"),
    ),
    ("out of range is a code", [exited(0, 255)], 1, Finished(255, None, "slurm-9-0: exited with code 255")),
    (
        "other reason is a code",
        [exited(0, 137, "ContainerStatusUnknown")],
        1,
        Finished(137, None, "slurm-9-0: exited with code 137"),
    ),
    (
        "OOM",
        [exited(0, 137, "OOMKilled")],
        1,
        Finished(
            137,
            9,
            "slurm-9-0: out of memory: killed by the kernel on reaching the job's memory limit",
            oom_killed=True,
        ),
    ),
    (
        "deadline with container",
        [pod(0, "Failed", {"terminated": {"exitCode": 137, "reason": "Error"}}, reason="DeadlineExceeded")],
        1,
        Finished(137, 9, "slurm-9-0: time limit reached", timed_out=True),
    ),
    (
        "deadline before start",
        [pod(0, "Failed", reason="DeadlineExceeded")],
        1,
        Finished(143, 15, "slurm-9-0: time limit reached", timed_out=True),
    ),
    (
        "timeout beats exit codes",
        [exited(0, 9), pod(1, "Failed", reason="DeadlineExceeded")],
        2,
        Finished(143, 15, "slurm-9-1: time limit reached", timed_out=True),
    ),
    (
        "evicted after running",
        [
            pod(
                0,
                "Failed",
                {"terminated": {"exitCode": 137, "reason": "Error"}},
                reason="Evicted",
                message="low on memory",
            )
        ],
        1,
        Finished(137, 9, "slurm-9-0: killed by signal 9 (SIGKILL) (Evicted: low on memory)",
                 by_kubernetes=True),
    ),
    (
        "failed while running",
        [pod(0, "Failed", {"running": {}}, reason="NodeLost")],
        1,
        Finished(1, None, "slurm-9-0: NodeLost"),
    ),
    (
        "kubelet refused",
        [pod(0, "Failed", reason="OutOfcpu", message="Node didn't have enough cpu")],
        1,
        FailedBeforeStart("slurm-9-0: Kubernetes refused the pod: OutOfcpu: Node didn't have enough cpu"),
    ),
    (
        "interpreter missing",
        [
            pod(
                0,
                "Failed",
                {
                    "terminated": {
                        "exitCode": 128,
                        "reason": "StartError",
                        "message": 'exec: "/bin/bash": no such file',
                    }
                },
            )
        ],
        1,
        FailedBeforeStart(
            'slurm-9-0: the container could not start: StartError: exec: "/bin/bash": no such file'
        ),
    ),
    (
        "deleted while running",
        [pod(0, "Running", {"running": {}}, deleting=True)],
        1,
        Finished(143, 15, "slurm-9-0: the pod was deleted in Kubernetes before the job ended"),
    ),
    (
        "deleted and exited uses the exit",
        [pod(0, "Failed", {"terminated": {"exitCode": 2, "reason": "Error"}}, deleting=True)],
        1,
        Finished(2, None, "slurm-9-0: exited with code 2"),
    ),
    (
        "invalid image at once",
        [waiting("InvalidImageName")],
        1,
        FailedBeforeStart("slurm-9-0: cannot pull image 'reg.io/app:1': InvalidImageName: boom"),
    ),
    (
        "never-pull at once",
        [waiting("ErrImageNeverPull")],
        1,
        FailedBeforeStart("slurm-9-0: cannot pull image 'reg.io/app:1': ErrImageNeverPull: boom"),
    ),
    ("pull error may heal", [waiting("ErrImagePull")], 1, Running("slurm-9-0: ErrImagePull")),
    ("backoff may heal", [waiting("ImagePullBackOff")], 1, Running("slurm-9-0: ImagePullBackOff")),
    (
        "pull error persisted",
        [waiting("ImagePullBackOff", LONG_AGO, "not found")],
        1,
        FailedBeforeStart("slurm-9-0: cannot pull image 'reg.io/app:1': ImagePullBackOff: not found"),
    ),
    (
        "config error may heal",
        [waiting("CreateContainerConfigError")],
        1,
        Running("slurm-9-0: CreateContainerConfigError"),
    ),
    (
        "config error persisted",
        [waiting("CreateContainerConfigError", LONG_AGO)],
        1,
        FailedBeforeStart("slurm-9-0: cannot create the container: CreateContainerConfigError: boom"),
    ),
    (
        "unschedulable persisted",
        [
            pod(
                0,
                "Pending",
                started=LONG_AGO,
                conditions=[
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "no fit",
                    }
                ],
            )
        ],
        1,
        FailedBeforeStart("slurm-9-0: cannot be placed on its node: no fit"),
    ),
    (
        "unschedulable may heal",
        [
            pod(
                0,
                "Pending",
                conditions=[
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "no fit",
                    }
                ],
            )
        ],
        1,
        Running("slurm-9-0: Pending"),
    ),
    (
        "failed start beats others",
        [exited(0, 5), waiting("InvalidImageName")],
        2,
        FailedBeforeStart("slurm-9-0: cannot pull image 'reg.io/app:1': InvalidImageName: boom"),
    ),
    (
        "node unknown keeps waiting",
        [pod(0, "Unknown", {"running": {}}, reason="NodeLost")],
        1,
        Running("slurm-9-0: NodeLost"),
    ),
]


@pytest.mark.parametrize(
    ("pods", "node_count", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_job_outcome(pods: list[dict[str, Any]], node_count: int, expected: Outcome) -> None:
    assert job_outcome(pods, node_count, now=NOW) == expected


def test_wait_for_all_keeps_running_until_every_pod_ends() -> None:
    pods = [running(0), exited(1, 4)]
    assert job_outcome(pods, 2, now=NOW, wait_for_all=True) == Running("slurm-9-0: Running")
    pods[0] = exited(0, 0)
    assert job_outcome(pods, 2, now=NOW, wait_for_all=True) == Finished(
        4, None, "slurm-9-1: exited with code 4"
    )


def test_grace_is_configurable() -> None:
    pods = [waiting("ErrImagePull")]
    assert isinstance(job_outcome(pods, 1, now=NOW, grace_s=1), FailedBeforeStart)
    assert isinstance(job_outcome(pods, 1, now=NOW, grace_s=3600), Running)


def test_naive_now_is_utc() -> None:
    assert isinstance(
        job_outcome([waiting("ErrImagePull", LONG_AGO)], 1, now=NOW.replace(tzinfo=None)), FailedBeforeStart
    )


def test_pod_view_tolerates_empty_and_odd_dicts() -> None:
    view = pod_view({"metadata": {"annotations": {"slurm-k8s-bridge/node-index": "x"}}, "status": None})
    assert (view.name, view.index, view.phase, view.terminated, view.since) == ("", 0, "", None, None)


def test_pod_view_reads_datetime_objects() -> None:
    raw = running()
    raw["status"]["startTime"] = NOW
    assert pod_view(raw).since == NOW


@pytest.mark.parametrize("reason", ["CreateContainerConfigError", "ErrImagePull", "ContainerCreating"])
def test_a_start_error_from_while_the_api_server_was_away_is_not_final_yet(reason: str) -> None:
    # An old pod whose kubelet could not read its Secret (or pull) while the API server was down:
    # CI's fault test restarts the API server under load. Final only a grace period after it is back.
    pods = [waiting(reason, LONG_AGO)]
    assert isinstance(job_outcome(pods, 1, now=NOW, calm_since=NOW - timedelta(seconds=10)), Running)
    calm_for_long = NOW - timedelta(seconds=120)
    assert isinstance(job_outcome(pods, 1, now=NOW, calm_since=calm_for_long), FailedBeforeStart)
    assert isinstance(job_outcome(pods, 1, now=NOW, calm_since=None), FailedBeforeStart)


def test_an_exit_is_final_whatever_the_api_server_did() -> None:
    outcome = job_outcome([exited(0, 3)], 1, now=NOW, calm_since=NOW)
    assert isinstance(outcome, Finished) and outcome.exit_code == 3
