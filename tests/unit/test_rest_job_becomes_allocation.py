"""A slurmrestd v0.0.45 job dict becomes a JobAllocation; missing fields get neutral defaults."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from bridge.core.model import JobAllocation, ModelError, NodeAllocation, allocation_from_rest

DATA = Path(__file__).parent / "data"


@pytest.fixture
def rest_job() -> dict[str, Any]:
    return json.loads((DATA / "rest_job_running.json").read_text())


def test_running_job_fixture(rest_job: dict[str, Any]) -> None:
    assert allocation_from_rest(rest_job) == JobAllocation(
        job_id=4242,
        name="train",
        user="alice",
        uid=1000,
        gid=1000,
        partition="sim",
        state="RUNNING",
        state_flags=frozenset(),
        nodes=(
            NodeAllocation("ksim0003", cpus=8, memory_mb=16384, gpu_indices=(0, 1)),
            NodeAllocation("ksim0004", cpus=4, memory_mb=8192, gpu_indices=(1, 3)),
        ),
        time_limit_s=3600,
        array_job_id=None,
        array_task_id=None,
        work_dir="/home/alice/project",
        start_time=1764513601,
        batch_host="ksim0003",
        cluster="sandbox",
        tasks=2,
    )


def test_nodelist_is_compressed(rest_job: dict[str, Any]) -> None:
    assert allocation_from_rest(rest_job).nodelist == "ksim[0003-0004]"


def _edit(job: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for key in parents:
        job = job[key]
    if value is _DELETE:
        del job[last]
    else:
        job[last] = value


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "attribute", "expected"),
    [
        ("time_limit", {"set": True, "infinite": True, "number": 0}, "time_limit_s", None),
        ("time_limit", {"set": False, "infinite": False, "number": 0}, "time_limit_s", None),
        ("time_limit", 5, "time_limit_s", 300),
        ("time_limit", _DELETE, "time_limit_s", None),
        ("array_job_id", {"set": True, "infinite": False, "number": 4200}, "array_job_id", 4200),
        ("start_time", {"set": True, "infinite": False, "number": 0}, "start_time", None),
        ("start_time", _DELETE, "start_time", None),
        ("job_state", ["RUNNING", "COMPLETING"], "state", "RUNNING"),
        ("job_state", ["COMPLETING", "CANCELLED"], "state_flags", frozenset({"COMPLETING"})),
        ("job_state", "PENDING", "state", "PENDING"),
        ("job_state", _DELETE, "state", ""),
        ("user_name", None, "user", ""),
        ("user_id", _DELETE, "uid", None),
        ("group_id", {"set": True, "infinite": False, "number": 100}, "gid", 100),
        ("current_working_directory", _DELETE, "work_dir", ""),
        ("partition", 7, "partition", ""),
        (
            "gres_detail",
            [],
            "nodes",
            (NodeAllocation("ksim0003", 8, 16384), NodeAllocation("ksim0004", 4, 8192)),
        ),
        (
            "job_resources",
            _DELETE,
            "nodes",
            (NodeAllocation("ksim0003", 0, 0, (0, 1)), NodeAllocation("ksim0004", 0, 0, (1, 3))),
        ),
        (
            "job_resources.nodes.allocation",
            [{"name": "ksim0004"}],
            "nodes",
            (NodeAllocation("ksim0003", 0, 0, (0, 1)), NodeAllocation("ksim0004", 0, 0, (1, 3))),
        ),
        # Without `nodes`, the allocation list gives the node order.
        ("nodes", _DELETE, "node_names", ("ksim0003", "ksim0004")),
    ],
)
def test_fields_are_read_defensively(
    rest_job: dict[str, Any], path: str, value: Any, attribute: str, expected: Any
) -> None:
    _edit(rest_job, path, value)
    assert getattr(allocation_from_rest(rest_job), attribute) == expected


def test_array_task_keeps_both_ids(rest_job: dict[str, Any]) -> None:
    rest_job["job_id"] = 4243
    rest_job["array_job_id"] = {"set": True, "infinite": False, "number": 4240}
    rest_job["array_task_id"] = {"set": True, "infinite": False, "number": 3}
    alloc = allocation_from_rest(rest_job)
    assert (alloc.job_id, alloc.array_job_id, alloc.array_task_id, alloc.is_array_task) == (
        4243,
        4240,
        3,
        True,
    )


def test_pending_job_has_no_nodes() -> None:
    alloc = allocation_from_rest({"job_id": 7, "job_state": ["PENDING"], "nodes": "", "gres_detail": []})
    assert (alloc.state, alloc.nodes, alloc.nodelist) == ("PENDING", (), "")


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("job_id", _DELETE, "valid job_id"),
        ("job_id", 0, "valid job_id"),
        ("nodes", "ksim[3-", "job 4242: unclosed"),
        ("gres_detail", ["gpu:1(IDX:N/A)", ""], "job 4242: .*without indices"),
        ("gres_detail", ["", "", ""], "job 4242: 3 gres_detail entries for 2 node"),
    ],
)
def test_malformed_fields_raise_model_error(
    rest_job: dict[str, Any], path: str, value: Any, message: str
) -> None:
    _edit(rest_job, path, value)
    with pytest.raises(ModelError, match=message):
        allocation_from_rest(rest_job)


def test_input_is_not_modified(rest_job: dict[str, Any]) -> None:
    before = copy.deepcopy(rest_job)
    allocation_from_rest(rest_job)
    assert rest_job == before
