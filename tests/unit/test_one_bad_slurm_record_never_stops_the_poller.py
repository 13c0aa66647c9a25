"""Issue 8, cause 7: one malformed job anywhere in the cluster (GPU gres without File=, say) raised
in the poller before the partition filter, and the poller failed for ever. Now each Slurm client
filters by the raw record's partition first, parses record by record, and logs and skips a bad
one. (The slurmrestd client's side runs against a stand-in server in
test_slurm_rest_client_polls_and_retries.)"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from structlog.testing import capture_logs

from bridge.clients.kube.cache import PodCache
from bridge.clients.slurm import JobListing, parse_listing
from bridge.clients.slurm.pyslurm_backend import PyslurmSlurmClient
from bridge.controller.metrics import Metrics
from bridge.controller.reconcile import Reconciler
from bridge.controller.sources import SlurmPoller
from bridge.core.model import ModelError

from .builders import allocation, config


def test_records_of_other_partitions_are_never_parsed_and_a_bad_one_is_logged_once() -> None:
    parsed: list[int] = []

    def parse(raw: dict[str, Any]) -> Any:
        parsed.append(raw["job_id"])
        if raw.get("bad"):
            raise ModelError(f"job {raw['job_id']}: gres gpu:2 without IDX")
        return allocation(job_id=raw["job_id"])

    records = [{"job_id": 1, "partition": "gpu", "bad": True}, {"job_id": 2, "partition": "k8s"},
               {"job_id": 3, "partition": "k8s", "bad": True}]
    reported: set[int] = set()

    def listing() -> JobListing:
        return parse_listing(records, read_at=5.0, partitions={"k8s"}, partition_of=lambda r: r["partition"],
                             job_id_of=lambda r: r["job_id"], parse=parse, reported=reported)

    with capture_logs() as logs:
        first, second = listing(), listing()

    assert parsed == [2, 3, 2, 3], "a job outside the bridged partitions was parsed"
    assert [j.job_id for j in first.jobs] == [2] and first.unreadable == {3}
    assert second == first
    skipped = [e for e in logs if e["event"] == "slurm.record_skipped"]
    assert [e["job_id"] for e in skipped] == [3], "logged once per job, with its id"


@dataclass
class FakeJob:
    """The pyslurm.Job properties the backend reads."""

    id: int
    partition: str
    gres: list[str]
    requeue_count: int = 0
    name: str = "j"
    array_id: int = 0
    time_limit: int | None = 5
    user_id: int = 1000
    group_id: int = 100
    allocated_nodes: str = "kube1"
    working_directory: str = "/home/alice"
    start_time: int = 1764513601
    batch_host: str = "kube1"
    is_batch_job: bool = True
    cluster: str = "sandbox"


class FakeExt:
    def __init__(self, jobs: list[FakeJob]) -> None:
        self.jobs = jobs

    def load_jobs(self, since: int) -> tuple[int, list[FakeJob]]:
        return 1234, self.jobs

    def job_state(self, job: FakeJob) -> tuple[str, list[str]]:
        return "RUNNING", []

    def node_resources(self, job: FakeJob) -> list[tuple[int, int]]:
        return [(2, 1024)]

    def gres_detail(self, job: FakeJob) -> list[str]:
        return job.gres

    def array_task_id(self, job: FakeJob) -> None:
        return None


def test_the_pyslurm_backend_skips_a_bad_record_and_reads_the_run() -> None:
    client = PyslurmSlurmClient.__new__(PyslurmSlurmClient)  # no libslurm here: only the parsing
    client._reported = set()
    client._ext = FakeExt([
        FakeJob(7, "gpu", ["gpu:2"]),  # GPUs without indices, elsewhere
        FakeJob(8, "k8s", ["gpu:1(IDX:3)"], requeue_count=2),
        FakeJob(9, "k8s", ["gpu:2"]),  # and one of ours
    ])

    answer = client._load_changed(0, {"k8s"}, 42.0)

    assert answer is not None
    last_update, listing = answer
    assert last_update == 1234 and listing.read_at == 42.0
    (job,) = listing.jobs
    assert (job.job_id, job.run, job.nodes[0].gpu_indices, job.read_at) == (8, 2, (3,), 42.0)
    assert listing.unreadable == {9}


async def test_a_job_whose_record_turns_unreadable_is_not_taken_for_gone() -> None:
    cache = PodCache()
    reconciler = Reconciler(config(), None, None, cache, Metrics(), lambda _job: None)  # type: ignore[arg-type]
    queued: list[int] = []
    poller = SlurmPoller(reconciler, queued.append, Metrics(), interval_s=0.2)
    first = JobListing(read_at=time.monotonic(), jobs=(allocation(read_at=0),))
    later = JobListing(read_at=time.monotonic(), jobs=(), unreadable=frozenset({42}))

    class Slurm:
        def __init__(self) -> None:
            self.answers = [first, later]

        async def changed_jobs(self, partitions: Any = None) -> JobListing:
            return self.answers.pop(0)

    reconciler.slurm = Slurm()  # type: ignore[assignment]
    await poller.poll_once()
    queued.clear()
    await poller.poll_once()

    view = reconciler.jobs.get(42)
    assert view is not None and view.listed and view.alloc is not None
    assert queued == [] and poller.synced.is_set()
