"""Steps a user starts in a bridged job: `srun --jobid N --overlap` into a running job, and every
srun of an allocation without a batch script (salloc, a bare srun).

The SPANK guard turns each task of such a step into the waiter's user-step proxy
(agent/internal/waiter/user_step.go), which asks the API to run the task's argv in the job's pod on its
node; the API (manager/user_steps_api.py) hands it here for the pod, and to controller.tasks to
run it. A job without a batch script has no waiter to hand over a payload: the first task of its
first step opens the run's session with one made from Slurm's record and that step's
`SLURM_K8S_IMAGE`; reconcile then creates the pods (each only holds its node: `agent wait`) and
removes them when Slurm ends the allocation, as for any run. After a daemon restart the next
step opens it again; the pods are found, not made twice.

Owns nothing but those openings (in the session registry) and the user-step task keys; called by
the API.
"""

from __future__ import annotations

import asyncio
import re
import shlex
from collections.abc import Callable, Mapping

import structlog

from bridge.controller.facade import over
from bridge.controller.jobstore import JobStore
from bridge.controller.run_pods import RunPods
from bridge.controller.sessions import SessionRegistry
from bridge.core.config import BridgeConfig
from bridge.core.directives import DirectiveError, parse_directives
from bridge.core.model import JobAllocation, JobPayload

log = structlog.get_logger(__name__)

IMAGE_VARIABLE = "SLURM_K8S_IMAGE"
"""Where an allocation without a script takes its image from (the first step's environment), as a
batch job takes it from its `#K8S image=` line; the partition's default_image otherwise."""
IMAGE_REFERENCE = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9._/:@-]{0,1023}")
"""What an image reference can look like (a container runtime checks the rest)."""
POD_WAIT_S = 120.0
"""How long a task waits for its node's pod to exist: an allocation's pods are made when its
first step starts, and the exec then waits for the container (controller.tasks)."""
POD_POLL_S = 0.25
STEP_ID = re.compile(r"[0-9]{1,10}")
PROCID = re.compile(r"[0-9]{1,9}")


class UserStepRefused(Exception):
    """The task cannot run; the message is for the user (srun's stderr)."""


INTERACTIVE_STEP_ENV = "-6"
"""SLURM_STEP_ID of salloc's interactive step (LaunchParameters=use_interactive_step): slurmstepd
prints SLURM_INTERACTIVE_STEP, 0xfffffffa, as a signed number."""


def task_key(step: str) -> str:
    """The controller.tasks key of a user step: its Slurm step id, apart from the script's keys."""
    if step == INTERACTIVE_STEP_ENV:
        return "u4294967290"
    if not STEP_ID.fullmatch(step):
        raise UserStepRefused(f"not a step id: {step[:20]!r}")
    return f"u{int(step)}"


def allocation_payload(alloc: JobAllocation, environment: Mapping[str, str], cwd: str) -> JobPayload:
    """The payload of an allocation without a batch script, from Slurm's record and the first
    step's environment; its `script` holds only the directives (the image), checked as a batch
    script's #K8S lines are."""
    image = environment.get(IMAGE_VARIABLE, "")
    if image and not IMAGE_REFERENCE.fullmatch(image):
        raise UserStepRefused(f"{IMAGE_VARIABLE}={image[:100]!r} is not an image name "
                              "([registry/]name[:tag][@digest])")
    script = f"#K8S image={shlex.quote(image)}\n" if image else ""
    try:
        parse_directives(script)
    except DirectiveError as error:
        raise UserStepRefused(f"{IMAGE_VARIABLE}={image[:100]!r} is not an image name: {error}") from None
    if alloc.uid is None or alloc.gid is None:
        raise UserStepRefused(f"Slurm did not tell job {alloc.job_id}'s uid and gid")
    work_dir = alloc.work_dir if alloc.work_dir.startswith("/") else cwd
    return JobPayload(script=script, environment=dict(environment), work_dir=work_dir,
                      uid=alloc.uid, gid=alloc.gid, allocation=True)


class UserSteps:
    def __init__(
        self, cfg: BridgeConfig, jobs: JobStore, pods: RunPods, sessions: SessionRegistry,
        wake: Callable[[int], None],
    ) -> None:
        """`wake(job_id)` queues the job, whose reconcile makes the pods of an opened allocation."""
        self._cfg = cfg
        self._jobs = jobs
        self._pods = pods
        self._sessions = sessions
        self._wake = wake

    def live(self, job_id: int, run: int) -> bool:
        """Run `run` of the job is still the one Slurm runs: its tasks are still wanted."""
        view = self._jobs.get(job_id)
        alloc = view.alloc if view is not None else None
        return alloc is not None and alloc.run == run and not over(alloc)

    async def pod_for(
        self, job_id: int, node: str, environment: Mapping[str, str], cwd: str,
    ) -> tuple[str, int]:
        """The pod (and run) a task of a user step on Slurm node `node` runs in, waiting for it to
        exist; for an allocation without a batch script, its pods are asked for first."""
        view = self._jobs.get(job_id)
        alloc = view.alloc if view is not None else None
        if alloc is None or over(alloc) or alloc.state != "RUNNING":
            raise UserStepRefused(f"job {job_id} is not running")
        if node not in alloc.node_names:
            raise UserStepRefused(f"node {node!r} is not one of job {job_id}'s")
        bound = log.bind(job_id=job_id, run=alloc.run, node=node)
        if not alloc.batch:
            self._open_allocation(alloc, environment, cwd, bound)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + POD_WAIT_S
        while True:
            # Started: an allocation's pod may still pull its image, or never start (then the
            # run's end says why, below).
            pod = self._pods.on_slurm_node(job_id, node)
            if pod is not None and pod.run == alloc.run and pod.started:
                return pod.name, alloc.run
            reason = self.why_not(job_id, alloc.run)
            if reason is not None:
                raise UserStepRefused(f"job {job_id} cannot run steps: {reason}")
            if not self.live(job_id, alloc.run):
                raise UserStepRefused(f"job {job_id} ended before its pod on {node} started")
            if loop.time() > deadline:
                raise UserStepRefused(f"job {job_id} has no pod on node {node} after {POD_WAIT_S:.0f} s")
            await asyncio.sleep(POD_POLL_S)

    def why_not(self, job_id: int, run: int) -> str | None:
        """Why the run's pods cannot take steps any more (they failed to start, or ended); None
        while they can."""
        session = self._sessions.get(job_id, run)
        final = session.final if session is not None else None
        if final is None:
            return None
        return str(final.get("reason") or "its pods have ended")

    def _open_allocation(
        self, alloc: JobAllocation, environment: Mapping[str, str], cwd: str, bound: structlog.BoundLogger,
    ) -> None:
        session = self._sessions.open(alloc.job_id, alloc.run)
        if session.payload is not None:
            return
        session.payload = allocation_payload(alloc, environment, cwd)
        bound.info("allocation.opened", image=environment.get(IMAGE_VARIABLE) or None)
        self._wake(alloc.job_id)
