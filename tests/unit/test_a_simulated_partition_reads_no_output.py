"""A partition of simulated (kwok) nodes: its pods run no containers and kwok serves no logs, so
the daemon reads none. Before `simulated`, every sim job's end waited out the relay's retries of
an unreadable log (1 + 2 s after the pod ended, measured in bench-scale: pod created → job over
4.3-7.1 s for a 1 s pod)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from bridge.clients.kube.cache import PodCache
from bridge.controller.metrics import Metrics
from bridge.controller.reconcile import Reconciler
from bridge.core import wellknown
from bridge.core.config import PartitionConfig, parse_config
from bridge.core.directives import parse_directives
from bridge.core.translate import desired_pods

from .builders import allocation, config, payload
from .test_log_relays_resume_until_the_container_ends import EXITED, Kube, Slurm


async def test_a_simulated_pod_ends_its_job_without_any_log_read() -> None:
    cache = PodCache()
    kube = Kube(cache)
    cfg = config(partitions={"k8s": PartitionConfig(default_image="img:1", simulated=True)})
    reconciler = Reconciler(cfg, Slurm(), kube, cache, Metrics(), lambda _job: None)  # type: ignore[arg-type]
    reconciler.jobs.record(replace(allocation(nodes=allocation().nodes[:1]), read_at=time.monotonic()))
    session = reconciler.attach_session(42, payload())
    session.payload = payload()
    queue = session.attach({})
    await reconciler.reconcile(42)
    await asyncio.sleep(0.05)  # a relay, had one started, would have read by now
    kube.set_status(EXITED)
    await reconciler.reconcile(42)
    await asyncio.sleep(0.05)

    events = [queue.get_nowait() for _ in range(queue.qsize())]
    assert kube.reads == [], "a simulated pod's log was read"
    assert events and events[-1]["type"] == "exit" and events[-1]["code"] == 0


def test_simulated_pods_say_they_have_no_output_and_others_keep_theirs() -> None:
    def output_of(part: PartitionConfig) -> str | None:
        pods = desired_pods(allocation(), payload(), parse_directives(payload().script), part,
                            config(partitions={"k8s": part}))
        return pods[0]["metadata"]["annotations"].get(wellknown.ANNOTATION_OUTPUT)

    assert output_of(PartitionConfig(default_image="img:1", simulated=True)) == wellknown.OUTPUT_NONE
    assert output_of(PartitionConfig(default_image="img:1")) != wellknown.OUTPUT_NONE


def test_the_setting_is_read_from_the_config_file() -> None:
    text = ('cluster = "c"\n[slurm]\nurl = "http://x"\n'
            '[partitions.sim]\ndefault_image = "i:1"\nsimulated = true\n')
    assert parse_config(text).partitions["sim"].simulated is True
