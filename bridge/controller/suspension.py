"""Suspend and resume: what slurmstepd does to a native job's processes, done in the pods.

`scontrol suspend N` (an admin, gang time-slicing, suspend preemption) makes slurmstepd stop every
process of a native job with SIGSTOP, and `scontrol resume` continue them with SIGCONT; Slurm does
not count the time in between against the job's limit. For a bridged job slurmstepd stops only the
waiter on the slurmd host: the job's processes are in its pods. The reconciler hands each pass's
Slurm state (suspended or not) and the run's pods here, and this brings every pod to it: the
pod's ANNOTATION_SUSPENDED set to `stopping`, `agent signal-all STOP` (core.agent_protocol), then
the mark `true`; or `agent signal-all CONT`, then the mark removed. The annotation is the record:
level-triggered, so a daemon restarted in between (or another replica taking over) continues a
pod that was stopped before. A run that ends while suspended is continued before its pods are
deleted (the reconciler's stop), as slurmd sends SIGCONT before SIGTERM: TERM traps run.

A pod that cannot be stopped or continued (its agent gone, the kubelet unreachable) is logged and
counted (`suspend_failures_total`), and tried again. Owns no state of its own.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable
from typing import Any

import structlog

from bridge.clients.kube.actions import KubeActions
from bridge.controller.metrics import Metrics
from bridge.core import agent_protocol, wellknown
from bridge.core.errors import BridgeError
from bridge.core.pod_view import PodView

log = structlog.get_logger(__name__)

STOP = agent_protocol.signal_all_command(int(signal.SIGSTOP))
CONTINUE = agent_protocol.signal_all_command(int(signal.SIGCONT))
RETRY_S = 2.0
"""A pod that could not be brought to Slurm's state is tried again this much later."""


class Suspension:
    def __init__(self, kube: KubeActions, metrics: Metrics) -> None:
        self._kube = kube
        self._metrics = metrics

    async def follow(self, suspended: bool, pods: Iterable[PodView], bound: Any) -> float | None:
        """Bring the run's pods to Slurm's state (`suspended` or running); when to look again
        (None: every pod is there)."""
        retry = None
        for pod in pods:
            want = "true" if suspended else None
            if pod.suspend_mark == want or pod.stopped or (suspended and not pod.started):
                continue  # a pod that has not started is stopped once it has (the next pass)
            try:
                # Marked before the stop, done after it; unmarked after the continue: whatever
                # fails in between (the daemon too), a pod that may be stopped carries a mark, so
                # a resume finds it, and a suspend not marked done is stopped again.
                if suspended:
                    if pod.suspend_mark is None:
                        await self._kube.annotate_pod(pod.name, wellknown.ANNOTATION_SUSPENDED, "stopping")
                    await self._kube.exec_in_pod(pod.name, STOP)
                    await self._kube.annotate_pod(pod.name, wellknown.ANNOTATION_SUSPENDED, "true")
                else:
                    await self._kube.exec_in_pod(pod.name, CONTINUE)
                    await self._kube.annotate_pod(pod.name, wellknown.ANNOTATION_SUSPENDED, None)
            except BridgeError as error:
                bound.warning("job.suspend_signal_failed", pod=pod.name, suspend=suspended, error=str(error))
                self._metrics.inc("suspend_failures_total")
                retry = RETRY_S
                continue
            bound.info("job.suspended" if suspended else "job.resumed", pod=pod.name)
        return retry
